package store

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// The schema version lives in PRAGMA user_version (in the file header, so it
// is read without any table existing and written inside the migration's
// transaction). migrations[i] takes the schema from version i to i+1. Append
// only: a released migration is never edited, since databases in the field
// have already run it.
var migrations = []string{
	// 1: API keys, sandboxes and their label index.
	`
CREATE TABLE api_keys (
	id        TEXT PRIMARY KEY,
	name      TEXT NOT NULL,
	tenant    TEXT NOT NULL,
	prefix    TEXT NOT NULL UNIQUE, -- display prefix; unique so RevokeKey(prefix) is unambiguous
	hash      BLOB NOT NULL UNIQUE, -- SHA-256 of the secret; the UNIQUE index is Authenticate's lookup
	created   INTEGER NOT NULL,
	last_used INTEGER,
	revoked   INTEGER,
	expires   INTEGER
) STRICT;

CREATE TABLE sandboxes (
	id       TEXT PRIMARY KEY,
	tenant   TEXT NOT NULL,
	state    TEXT NOT NULL,
	reason   TEXT NOT NULL DEFAULT '',
	spec     TEXT,
	handle   TEXT,
	extra    TEXT,
	labels   TEXT NOT NULL DEFAULT '{}', -- the copy that is read back
	metadata TEXT NOT NULL DEFAULT '{}',
	created  INTEGER NOT NULL,
	updated  INTEGER NOT NULL,
	version  INTEGER NOT NULL
) STRICT;

-- Listing walks (created, id) in order, per tenant or across all of them.
CREATE INDEX sandboxes_created ON sandboxes (created, id);
CREATE INDEX sandboxes_tenant_created ON sandboxes (tenant, created, id);

-- One row per label, the copy that is searched: a label filter is an index
-- lookup instead of parsing every row's JSON.
CREATE TABLE sandbox_labels (
	sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	key        TEXT NOT NULL,
	value      TEXT NOT NULL,
	PRIMARY KEY (sandbox_id, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX sandbox_labels_kv ON sandbox_labels (key, value, sandbox_id);
`,
	// 2: templates (a tenant's named recipes, their current generation and
	// warm pool size) and layers (the built generations on disk).
	`
CREATE TABLE templates (
	tenant     TEXT NOT NULL,
	name       TEXT NOT NULL,
	spec       TEXT NOT NULL,             -- the definition, JSON owned by the manager
	generation TEXT NOT NULL DEFAULT '', -- the current generation ('' until built)
	pool_size  INTEGER NOT NULL DEFAULT 0,
	build      TEXT,                      -- the last build's outcome, JSON
	created    INTEGER NOT NULL,
	updated    INTEGER NOT NULL,
	PRIMARY KEY (tenant, name)
) STRICT;

CREATE TABLE layers (
	id       TEXT PRIMARY KEY,        -- the generation: a hash of what went into it
	tenant   TEXT NOT NULL,
	dir      TEXT NOT NULL UNIQUE,    -- its directory under DATA/layers
	template TEXT NOT NULL DEFAULT '',
	kind     TEXT NOT NULL,           -- build, snapshot or fork
	base     TEXT NOT NULL DEFAULT '',
	chain    TEXT NOT NULL,           -- JSON: the layer dirs a sandbox stacks, lowest first, ending with dir
	bytes    INTEGER NOT NULL DEFAULT 0,
	files    INTEGER NOT NULL DEFAULT 0,
	created  INTEGER NOT NULL
) STRICT;
`,
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func userVersion(ctx context.Context, q querier) (int, error) {
	var v int
	err := q.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v)
	return v, err
}

// checkVersion refuses a database from a newer hutch: its schema may mean
// things this code does not know, and writing to it could corrupt it for the
// version that made it.
func checkVersion(have, known int) error {
	if have > known {
		return fmt.Errorf("store: database schema version %d is newer than this hutch knows (%d); upgrade hutch: %w",
			have, known, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// migrate applies the migrations the database has not seen, each in its own
// transaction, so a failure leaves the database at the last good version.
func migrate(ctx context.Context, db *sql.DB, migs []string) error {
	v, err := userVersion(ctx, db)
	if err != nil {
		return fmt.Errorf("store: read schema version: %w", classify(err))
	}
	if err := checkVersion(v, len(migs)); err != nil {
		return err
	}
	for next := v + 1; next <= len(migs); next++ {
		if err := migrateTo(ctx, db, next, migs[next-1]); err != nil {
			return err
		}
	}
	// Another process may have run a newer hutch's migrations meanwhile.
	if v, err = userVersion(ctx, db); err != nil {
		return fmt.Errorf("store: read schema version: %w", classify(err))
	}
	return checkVersion(v, len(migs))
}

// migrateTo runs one migration. The version is read again inside the
// (immediate) transaction: another process may have migrated meanwhile.
func migrateTo(ctx context.Context, db *sql.DB, to int, ddl string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: migration %d: %w", to, classify(err))
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	v, err := userVersion(ctx, tx)
	if err != nil {
		return fmt.Errorf("store: migration %d: %w", to, classify(err))
	}
	switch {
	case v >= to:
		return nil
	case v != to-1:
		return fmt.Errorf("store: migration %d: database is at version %d: %w", to, v, errdefs.ErrFailedPrecondition)
	}
	if _, err := tx.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("store: migration %d: %w", to, classify(err))
	}
	// PRAGMA takes no parameters; to is our own integer.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", to)); err != nil {
		return fmt.Errorf("store: migration %d: set version: %w", to, classify(err))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: migration %d: commit: %w", to, classify(err))
	}
	return nil
}
