package store

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// ListFilter selects sandboxes. The zero value lists the first 100 of every
// tenant.
type ListFilter struct {
	Tenant    string            // "" = all tenants
	States    []string          // any of; empty = all
	Labels    map[string]string // all must match exactly
	Limit     int               // default 100, max 1000
	PageToken string            // from the previous page; opaque
}

const (
	defaultLimit = 100
	maxLimit     = 1000
	// maxTerms bounds the IN list and the label subqueries, so a filter
	// cannot build a statement past SQLite's variable limit.
	maxTerms = 100
	// maxTokenLen refuses absurd tokens before decoding them.
	maxTokenLen = 1024
	tokenV1     = 1
)

// ListSandboxes returns one page of sandboxes ordered by (created, id) and
// the token of the next page, "" after the last. Pages are keyset-based, so
// rows inserted or deleted between pages neither repeat nor shift others.
func (s *Store) ListSandboxes(ctx context.Context, f ListFilter) ([]Sandbox, string, error) {
	limit, err := checkFilter(f)
	if err != nil {
		return nil, "", err
	}
	query, args, err := listQuery(f, limit+1) // one extra row says whether a next page exists
	if err != nil {
		return nil, "", err
	}
	rows, err := s.r.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, "", fmt.Errorf("store: list sandboxes: %w", classify(err))
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, "", fmt.Errorf("store: list sandboxes: %w", classify(err))
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("store: list sandboxes: %w", classify(err))
	}
	if len(out) <= limit {
		return out, "", nil
	}
	out = out[:limit]
	last := out[limit-1]
	return out, encodePageToken(ts(last.Created), last.ID), nil
}

func checkFilter(f ListFilter) (int, error) {
	switch {
	case f.Limit < 0 || f.Limit > maxLimit:
		return 0, fmt.Errorf("store: list limit %d is outside 0..%d: %w", f.Limit, maxLimit, errdefs.ErrInvalidArgument)
	case len(f.States) > maxTerms || len(f.Labels) > maxTerms:
		return 0, fmt.Errorf("store: list filter has more than %d states or labels: %w", maxTerms, errdefs.ErrInvalidArgument)
	case f.Limit == 0:
		return defaultLimit, nil
	}
	return f.Limit, nil
}

// listQuery builds the SELECT for f. Every condition is SQL, so a filter
// reads only matching rows: tenant and the page position use the
// (tenant, created, id) or (created, id) index, labels the (key, value) one.
func listQuery(f ListFilter, limit int) (string, []any, error) {
	var q strings.Builder
	var args []any
	q.WriteString(`SELECT ` + sandboxCols + ` FROM sandboxes WHERE 1 = 1`)
	if f.Tenant != "" {
		q.WriteString(` AND tenant = ?`)
		args = append(args, f.Tenant)
	}
	if len(f.States) > 0 {
		q.WriteString(` AND state IN (?` + strings.Repeat(`, ?`, len(f.States)-1) + `)`)
		for _, st := range f.States {
			args = append(args, st)
		}
	}
	// Sorted, so that equal filters give equal statements (and the same
	// cached plan).
	for _, k := range slices.Sorted(maps.Keys(f.Labels)) {
		q.WriteString(` AND id IN (SELECT sandbox_id FROM sandbox_labels WHERE key = ? AND value = ?)`)
		args = append(args, k, f.Labels[k])
	}
	if f.PageToken != "" {
		created, id, err := decodePageToken(f.PageToken)
		if err != nil {
			return "", nil, err
		}
		q.WriteString(` AND (created, id) > (?, ?)`)
		args = append(args, created, id)
	}
	q.WriteString(` ORDER BY created, id LIMIT ?`)
	args = append(args, limit)
	return q.String(), args, nil
}

// A page token is base64url of: version byte, created (8 bytes, big-endian
// nanoseconds), then the ID, i.e. the position of the last row returned.
// The version byte lets the format change without misreading old tokens.
func encodePageToken(created int64, id string) string {
	b := make([]byte, 0, 9+len(id))
	b = append(b, tokenV1)
	b = binary.BigEndian.AppendUint64(b, uint64(created))
	b = append(b, id...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodePageToken parses a token from a client; anything malformed is
// ErrInvalidArgument, never a panic.
func decodePageToken(tok string) (created int64, id string, err error) {
	bad := func(why string) (int64, string, error) {
		return 0, "", fmt.Errorf("store: malformed page token: %s: %w", why, errdefs.ErrInvalidArgument)
	}
	if len(tok) > maxTokenLen {
		return bad("too long")
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return bad("not base64url")
	}
	if len(b) < 10 || b[0] != tokenV1 {
		return bad("unknown format")
	}
	return int64(binary.BigEndian.Uint64(b[1:9])), string(b[9:]), nil
}
