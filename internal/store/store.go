// Package store is the daemon's durable state: API keys (one per tenant) and
// the manager's sandbox records, in one SQLite file. It exists so that a
// daemon restart loses nothing the manager needs to re-adopt its sandboxes,
// and so that every component shares one schema, one migration path and one
// way of classifying errors (errdefs) instead of each keeping its own files.
//
// SQLite runs in WAL mode with exactly one writer connection: every write goes
// through it, so writes are serialized in Go (database/sql queues callers for
// the single connection) and never fight over the file lock, which is what
// produces "database is locked". Reads use a separate pool and, thanks to WAL,
// never wait for the writer.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// busyTimeoutMS bounds how long a connection waits for a lock held by another
// process (a second daemon, the sqlite3 shell). Inside one Store the single
// writer means writers never wait on each other.
const busyTimeoutMS = 5000

// Store is an open database. It is safe for concurrent use.
type Store struct {
	w *sql.DB // the one writer connection (MaxOpenConns 1)
	r *sql.DB // the read pool (query_only)
	// The hot reads, prepared once per pooled connection instead of on
	// every call: that halves the cost of authenticating a request.
	keyByHash, sandboxByID *sql.Stmt
	// now is the clock; tests replace it to cross expiry and the last_used
	// throttle without sleeping.
	now func() time.Time
}

// Open opens (creating if needed) the database at path with mode 0600 and
// brings its schema up to date. A database written by a newer hutch is
// refused with errdefs.ErrFailedPrecondition and left untouched.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		return nil, fmt.Errorf("store: empty database path: %w", errdefs.ErrInvalidArgument)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := createFile(abs); err != nil {
		return nil, err
	}
	w, err := sql.Open("sqlite", dsn(abs, false))
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	s := &Store{w: w, now: time.Now}
	if err := s.init(ctx, abs); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// init checks the version before anything can write to the file, then
// switches to WAL, migrates, and opens the read pool.
func (s *Store) init(ctx context.Context, abs string) error {
	v, err := userVersion(ctx, s.w)
	if err != nil {
		return fmt.Errorf("store: read schema version of %s: %w", abs, classify(err))
	}
	if err := checkVersion(v, len(migrations)); err != nil {
		return err
	}
	// The file may predate us with looser permissions; the keys table is
	// in it, so tighten it. New files are created 0600 by createFile, and
	// SQLite gives -wal and -shm the main file's mode.
	if err := os.Chmod(abs, 0o600); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if err := enableWAL(ctx, s.w); err != nil {
		return err
	}
	if err := migrate(ctx, s.w, migrations); err != nil {
		return err
	}
	s.r, err = sql.Open("sqlite", dsn(abs, true))
	if err != nil {
		return fmt.Errorf("store: open read pool: %w", err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	s.r.SetMaxOpenConns(n)
	// Keep them all: opening a connection re-runs the DSN pragmas, which
	// would cost more than the queries it serves.
	s.r.SetMaxIdleConns(n)
	if s.keyByHash, err = s.r.PrepareContext(ctx, keyByHashSQL); err != nil {
		return fmt.Errorf("store: prepare: %w", err)
	}
	if s.sandboxByID, err = s.r.PrepareContext(ctx, sandboxByIDSQL); err != nil {
		return fmt.Errorf("store: prepare: %w", err)
	}
	return nil
}

// Close closes the database. The read pool goes first so that the writer is
// the last connection: SQLite then checkpoints the WAL into the main file
// and removes it.
func (s *Store) Close() error {
	var errs []error
	for _, st := range []*sql.Stmt{s.keyByHash, s.sandboxByID} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	if s.r != nil {
		errs = append(errs, s.r.Close())
	}
	if s.w != nil {
		errs = append(errs, s.w.Close())
	}
	return errors.Join(errs...)
}

// createFile makes sure the database file exists with mode 0600 before
// SQLite opens it; SQLite would otherwise create it 0644 (less umask).
func createFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("store: create %s: %w", path, err)
	}
	return f.Close()
}

// dsn builds a file: URI (so a path with '?', '#' or '%' survives) with the
// per-connection settings. journal_mode is deliberately absent: it is
// persistent and is set once, after the version check, so that opening a
// database we must refuse never rewrites its header.
func dsn(path string, readOnly bool) string {
	q := url.Values{}
	q.Set("_busy_timeout", fmt.Sprint(busyTimeoutMS))
	q.Set("_foreign_keys", "on")
	q.Set("_synchronous", "NORMAL") // safe in WAL: a crash loses at most the last commits, never integrity
	q.Set("_defensive", "1")        // no SQL may corrupt the file on purpose
	q.Set("_dqs", "0")              // a mistyped "identifier" is an error, not a string
	if readOnly {
		q.Set("_query_only", "1")
	} else {
		// BEGIN IMMEDIATE: take the write lock up front, so a transaction
		// never fails half-way on a lock upgrade against another process.
		q.Set("_txlock", "immediate")
	}
	u := url.URL{Scheme: "file", Path: path, RawQuery: q.Encode()}
	return u.String()
}

// enableWAL switches the file to WAL (a persistent setting) and checks that
// SQLite agreed: it silently keeps the old mode on some filesystems.
func enableWAL(ctx context.Context, db *sql.DB) error {
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode); err != nil {
		return fmt.Errorf("store: enable WAL: %w", classify(err))
	}
	if mode != "wal" {
		return fmt.Errorf("store: journal mode is %q, not wal: %w", mode, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// write runs fn in a transaction on the writer connection. fn must use tx
// only: touching s.w again would wait for the connection fn is holding.
func (s *Store) write(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: begin: %w", classify(err))
	}
	if err := fn(tx); err != nil {
		return errors.Join(err, ignoreDone(tx.Rollback()))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: commit: %w", classify(err))
	}
	return nil
}

func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// sqliteCode returns SQLite's extended result code for err, or 0.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code()
	}
	return 0
}

// classify gives the errdefs class to the SQLite failures callers can act
// on; everything else stays unclassified (internal).
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", errdefs.ErrDeadlineExceeded, err)
	}
	switch sqliteCode(err) & 0xff {
	case sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT:
		return fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	case sqlite3.SQLITE_FULL:
		return fmt.Errorf("%w: %w", errdefs.ErrResourceExhausted, err)
	}
	return err
}

// ts and fromTS are the one time encoding: integer nanoseconds since the
// epoch, UTC. Integers sort and compare correctly in SQL and round-trip
// exactly, which the page tokens rely on.
func ts(t time.Time) int64 { return t.UnixNano() }

func fromTS(n int64) time.Time { return time.Unix(0, n).UTC() }

func nullTS(t *time.Time) any {
	if t == nil {
		return nil
	}
	return ts(*t)
}

func fromNullTS(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := fromTS(n.Int64)
	return &t
}
