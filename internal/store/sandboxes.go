package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
	"unicode/utf8"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Sandbox is the manager's record of a sandbox. Spec, Handle and Extra are
// opaque JSON owned by the caller; the store only checks that they parse.
type Sandbox struct {
	ID       string            `json:"id"`
	Tenant   string            `json:"tenant"`
	State    string            `json:"state"`
	Reason   string            `json:"reason,omitempty"`
	Spec     json.RawMessage   `json:"spec"`
	Handle   json.RawMessage   `json:"handle,omitempty"`
	Extra    json.RawMessage   `json:"extra,omitempty"` // lifecycle data (timers etc.)
	Labels   map[string]string `json:"labels,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Created  time.Time         `json:"created"`
	Updated  time.Time         `json:"updated"`
	Version  int64             `json:"version"` // optimistic concurrency: bumped by every update
}

const (
	sandboxCols = `id, tenant, state, reason, spec, handle, extra, labels, metadata, created, updated, version`
	// tenant '' matches any tenant.
	sandboxByIDSQL = `SELECT ` + sandboxCols + ` FROM sandboxes WHERE id = ?1 AND (?2 = '' OR tenant = ?2)`
)

// InsertSandbox stores a new sandbox at Version 1 with Created and Updated
// set to now, and returns it as stored. A duplicate ID is ErrAlreadyExists.
func (s *Store) InsertSandbox(ctx context.Context, sb Sandbox) (Sandbox, error) {
	if sb.ID == "" {
		return Sandbox{}, fmt.Errorf("store: sandbox without an id: %w", errdefs.ErrInvalidArgument)
	}
	f, err := encodeSandbox(sb)
	if err != nil {
		return Sandbox{}, err
	}
	now := ts(s.now())
	var out Sandbox
	err = s.write(ctx, func(tx *sql.Tx) error {
		row := tx.QueryRowContext(ctx, `INSERT INTO sandboxes (`+sandboxCols+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1) RETURNING `+sandboxCols,
			sb.ID, sb.Tenant, sb.State, sb.Reason, f.spec, f.handle, f.extra, f.labels, f.metadata, now, now)
		got, err := scanSandbox(row)
		if err != nil {
			if sqliteCode(err) == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY {
				return fmt.Errorf("store: sandbox %q: %w", sb.ID, errdefs.ErrAlreadyExists)
			}
			return fmt.Errorf("store: insert sandbox %q: %w", sb.ID, classify(err))
		}
		out = got
		return putLabels(ctx, tx, sb.ID, sb.Labels, false)
	})
	if err != nil {
		return Sandbox{}, err
	}
	return out, nil
}

// UpdateSandbox replaces the mutable fields (everything but ID, Tenant and
// Created) of the sandbox with sb.ID, provided it is still at sb.Version.
// Someone else's update in between is ErrConflict, and nothing changes: the
// caller re-reads and decides again. It returns the row at Version+1.
func (s *Store) UpdateSandbox(ctx context.Context, sb Sandbox) (Sandbox, error) {
	return s.updateSandbox(ctx, sb, false)
}

// updateSandbox is UpdateSandbox and, with reassign, ReassignSandbox: the
// same versioned update, which then also sets the tenant and the creation
// time.
func (s *Store) updateSandbox(ctx context.Context, sb Sandbox, reassign bool) (Sandbox, error) {
	f, err := encodeSandbox(sb)
	if err != nil {
		return Sandbox{}, err
	}
	now := ts(s.now())
	op, set, args := "update", "", []any{}
	if reassign {
		op, set, args = "reassign", "tenant = ?, created = ?, ", []any{sb.Tenant, now}
	}
	args = append(args, sb.State, sb.Reason, f.spec, f.handle, f.extra, f.labels, f.metadata, now, sb.ID, sb.Version)
	var out Sandbox
	err = s.write(ctx, func(tx *sql.Tx) error {
		row := tx.QueryRowContext(ctx, `UPDATE sandboxes SET `+set+`state = ?, reason = ?, spec = ?, handle = ?, extra = ?,
			labels = ?, metadata = ?, updated = ?, version = version + 1
			WHERE id = ? AND version = ? RETURNING `+sandboxCols, args...)
		got, err := scanSandbox(row)
		if errors.Is(err, sql.ErrNoRows) {
			return whyNotUpdated(ctx, tx, sb)
		}
		if err != nil {
			return fmt.Errorf("store: %s sandbox %q: %w", op, sb.ID, classify(err))
		}
		out = got
		return putLabels(ctx, tx, sb.ID, sb.Labels, true)
	})
	if err != nil {
		return Sandbox{}, err
	}
	return out, nil
}

// whyNotUpdated tells a missing sandbox from a stale version.
func whyNotUpdated(ctx context.Context, tx *sql.Tx, sb Sandbox) error {
	var v int64
	err := tx.QueryRowContext(ctx, `SELECT version FROM sandboxes WHERE id = ?`, sb.ID).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: sandbox %q: %w", sb.ID, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("store: update sandbox %q: %w", sb.ID, classify(err))
	}
	return fmt.Errorf("store: sandbox %q is at version %d, not %d: %w", sb.ID, v, sb.Version, errdefs.ErrConflict)
}

// GetSandbox returns one sandbox. tenant "" matches any tenant (the trusted
// local socket); otherwise another tenant's sandbox is ErrNotFound, exactly
// like a missing one, so IDs do not leak across tenants.
func (s *Store) GetSandbox(ctx context.Context, tenant, id string) (Sandbox, error) {
	sb, err := scanSandbox(s.sandboxByID.QueryRowContext(ctx, id, tenant))
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, fmt.Errorf("store: sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("store: get sandbox %q: %w", id, classify(err))
	}
	return sb, nil
}

// DeleteSandbox removes a sandbox and its labels. A missing one is not an
// error: deletion is retried after crashes and must converge.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	// sandbox_labels rows go with it (ON DELETE CASCADE, foreign_keys=on).
	if _, err := s.w.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("store: delete sandbox %q: %w", id, classify(err))
	}
	return nil
}

// putLabels writes the searchable copy of the labels, replacing the old
// rows on update. It runs in the same transaction as the row itself, so the
// two copies never disagree.
func putLabels(ctx context.Context, tx *sql.Tx, id string, labels map[string]string, replace bool) error {
	if replace {
		if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_labels WHERE sandbox_id = ?`, id); err != nil {
			return fmt.Errorf("store: labels of %q: %w", id, classify(err))
		}
	}
	if len(labels) == 0 {
		return nil
	}
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO sandbox_labels (sandbox_id, key, value) VALUES (?, ?, ?)`)
	if err != nil {
		return fmt.Errorf("store: labels of %q: %w", id, classify(err))
	}
	defer stmt.Close()
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if _, err := stmt.ExecContext(ctx, id, k, labels[k]); err != nil {
			return fmt.Errorf("store: labels of %q: %w", id, classify(err))
		}
	}
	return nil
}

// encoded holds a sandbox's column values in their stored form.
type encoded struct {
	spec, handle, extra any
	labels, metadata    string
}

func encodeSandbox(sb Sandbox) (encoded, error) {
	var f encoded
	var err error
	if sb.State == "" {
		return f, fmt.Errorf("store: sandbox %q without a state: %w", sb.ID, errdefs.ErrInvalidArgument)
	}
	if f.spec, err = rawColumn("spec", sb.Spec); err != nil {
		return f, err
	}
	if f.handle, err = rawColumn("handle", sb.Handle); err != nil {
		return f, err
	}
	if f.extra, err = rawColumn("extra", sb.Extra); err != nil {
		return f, err
	}
	if f.labels, err = mapColumn("labels", sb.Labels); err != nil {
		return f, err
	}
	f.metadata, err = mapColumn("metadata", sb.Metadata)
	return f, err
}

// rawColumn stores caller JSON as TEXT (readable with the sqlite3 shell and
// JSON1), or NULL when empty.
func rawColumn(name string, raw json.RawMessage) (any, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("store: sandbox %s is not valid JSON: %w", name, errdefs.ErrInvalidArgument)
	}
	return string(raw), nil
}

// mapColumn encodes labels or metadata. Invalid UTF-8 is refused rather than
// silently replaced by encoding/json, which would make the stored labels
// differ from the searchable copy.
func mapColumn(name string, m map[string]string) (string, error) {
	for k, v := range m {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return "", fmt.Errorf("store: sandbox %s are not valid UTF-8: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	if len(m) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

func scanSandbox(row scanner) (Sandbox, error) {
	var sb Sandbox
	var labels, metadata string
	var created, updated int64
	err := row.Scan(&sb.ID, &sb.Tenant, &sb.State, &sb.Reason,
		(*[]byte)(&sb.Spec), (*[]byte)(&sb.Handle), (*[]byte)(&sb.Extra),
		&labels, &metadata, &created, &updated, &sb.Version)
	if err != nil {
		return Sandbox{}, err
	}
	if sb.Labels, err = decodeMap(labels); err != nil {
		return Sandbox{}, fmt.Errorf("labels of %q: %w", sb.ID, err)
	}
	if sb.Metadata, err = decodeMap(metadata); err != nil {
		return Sandbox{}, fmt.Errorf("metadata of %q: %w", sb.ID, err)
	}
	sb.Created, sb.Updated = fromTS(created), fromTS(updated)
	return sb, nil
}

// decodeMap returns nil for an empty map so that omitempty omits it.
func decodeMap(s string) (map[string]string, error) {
	if s == "{}" {
		return nil, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, err
	}
	if len(m) == 0 {
		return nil, nil
	}
	return m, nil
}
