package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Template is a tenant's named template. Spec and Build are opaque JSON
// owned by the manager; (Tenant, Name) is the key, so names are per tenant.
type Template struct {
	Tenant     string          `json:"tenant"`
	Name       string          `json:"name"`
	Spec       json.RawMessage `json:"spec"`
	Generation string          `json:"generation,omitempty"` // the current one, "" until built
	PoolSize   int             `json:"pool_size"`
	Build      json.RawMessage `json:"build,omitempty"` // the last build's outcome
	Created    time.Time       `json:"created"`
	Updated    time.Time       `json:"updated"`
}

const templateCols = `tenant, name, spec, generation, pool_size, build, created, updated`

// PutTemplate creates or replaces the template (Tenant, Name) and returns
// it as stored; Created is kept on a replace.
func (s *Store) PutTemplate(ctx context.Context, t Template) (Template, error) {
	if t.Name == "" {
		return Template{}, fmt.Errorf("store: template without a name: %w", errdefs.ErrInvalidArgument)
	}
	spec, err := rawColumn("spec", t.Spec)
	if err != nil || spec == nil {
		return Template{}, fmt.Errorf("store: template %q: spec must be JSON: %w", t.Name, errdefs.ErrInvalidArgument)
	}
	build, err := rawColumn("build", t.Build)
	if err != nil {
		return Template{}, err
	}
	now := ts(s.now())
	var out Template
	err = s.write(ctx, func(tx *sql.Tx) error {
		row := tx.QueryRowContext(ctx, `INSERT INTO templates (`+templateCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (tenant, name) DO UPDATE SET spec = excluded.spec, generation = excluded.generation,
				pool_size = excluded.pool_size, build = excluded.build, updated = excluded.updated
			RETURNING `+templateCols, t.Tenant, t.Name, spec, t.Generation, t.PoolSize, build, now, now)
		got, err := scanTemplate(row)
		if err != nil {
			return fmt.Errorf("store: put template %q: %w", t.Name, classify(err))
		}
		out = got
		return nil
	})
	return out, err
}

// GetTemplate returns tenant's template name. Another tenant's template is
// ErrNotFound like a missing one; tenant "" is a tenant of its own here
// (the local socket's templates), not a wildcard.
func (s *Store) GetTemplate(ctx context.Context, tenant, name string) (Template, error) {
	row := s.r.QueryRowContext(ctx, `SELECT `+templateCols+` FROM templates WHERE tenant = ? AND name = ?`, tenant, name)
	t, err := scanTemplate(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Template{}, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return Template{}, fmt.Errorf("store: get template %q: %w", name, classify(err))
	}
	return t, nil
}

// ListTemplates lists tenant's templates by name, or every tenant's (by
// tenant, then name) when all is set.
func (s *Store) ListTemplates(ctx context.Context, tenant string, all bool) ([]Template, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+templateCols+` FROM templates WHERE ?1 OR tenant = ?2
		ORDER BY tenant, name`, all, tenant)
	if err != nil {
		return nil, fmt.Errorf("store: list templates: %w", classify(err))
	}
	defer rows.Close()
	var out []Template
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list templates: %w", classify(err))
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list templates: %w", classify(err))
	}
	return out, nil
}

// DeleteTemplate removes tenant's template name; a missing one is
// ErrNotFound.
func (s *Store) DeleteTemplate(ctx context.Context, tenant, name string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM templates WHERE tenant = ? AND name = ?`, tenant, name)
	if err != nil {
		return fmt.Errorf("store: delete template %q: %w", name, classify(err))
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	return nil
}

func scanTemplate(row scanner) (Template, error) {
	var t Template
	var created, updated int64
	err := row.Scan(&t.Tenant, &t.Name, (*[]byte)(&t.Spec), &t.Generation, &t.PoolSize, (*[]byte)(&t.Build), &created, &updated)
	if err != nil {
		return Template{}, err
	}
	t.Created, t.Updated = fromTS(created), fromTS(updated)
	return t, nil
}

// Layer is a generation on disk: a read-only layer directory and the chain
// of layer directories a sandbox stacks to use it.
type Layer struct {
	ID       string    `json:"id"`
	Tenant   string    `json:"tenant"`
	Dir      string    `json:"dir"`
	Template string    `json:"template,omitempty"`
	Kind     string    `json:"kind"`
	Base     string    `json:"base,omitempty"`
	Chain    []string  `json:"chain"`
	Bytes    int64     `json:"bytes"`
	Files    int       `json:"files"`
	Created  time.Time `json:"created"`
}

const layerCols = `id, tenant, dir, template, kind, base, chain, bytes, files, created`

// PutLayer records a layer (replacing a row with the same id).
func (s *Store) PutLayer(ctx context.Context, l Layer) error {
	if l.ID == "" || l.Dir == "" {
		return fmt.Errorf("store: layer without an id or dir: %w", errdefs.ErrInvalidArgument)
	}
	chain, err := json.Marshal(l.Chain)
	if err != nil {
		return err
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO layers (`+layerCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET tenant = excluded.tenant, dir = excluded.dir, template = excluded.template,
			kind = excluded.kind, base = excluded.base, chain = excluded.chain, bytes = excluded.bytes,
			files = excluded.files, created = excluded.created`,
		l.ID, l.Tenant, l.Dir, l.Template, l.Kind, l.Base, string(chain), l.Bytes, l.Files, ts(s.now()))
	if err != nil {
		return fmt.Errorf("store: put layer %q: %w", l.ID, classify(err))
	}
	return nil
}

// GetLayer returns the layer id.
func (s *Store) GetLayer(ctx context.Context, id string) (Layer, error) {
	l, err := scanLayer(s.r.QueryRowContext(ctx, `SELECT `+layerCols+` FROM layers WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Layer{}, fmt.Errorf("generation %q: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return Layer{}, fmt.Errorf("store: get layer %q: %w", id, classify(err))
	}
	return l, nil
}

// ListLayers lists every layer, oldest first.
func (s *Store) ListLayers(ctx context.Context) ([]Layer, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+layerCols+` FROM layers ORDER BY created, id`)
	if err != nil {
		return nil, fmt.Errorf("store: list layers: %w", classify(err))
	}
	defer rows.Close()
	var out []Layer
	for rows.Next() {
		l, err := scanLayer(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list layers: %w", classify(err))
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list layers: %w", classify(err))
	}
	return out, nil
}

// DeleteLayer forgets the layer id; a missing one is no error.
func (s *Store) DeleteLayer(ctx context.Context, id string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM layers WHERE id = ?`, id); err != nil {
		return fmt.Errorf("store: delete layer %q: %w", id, classify(err))
	}
	return nil
}

func scanLayer(row scanner) (Layer, error) {
	var l Layer
	var chain string
	var created int64
	if err := row.Scan(&l.ID, &l.Tenant, &l.Dir, &l.Template, &l.Kind, &l.Base, &chain, &l.Bytes, &l.Files, &created); err != nil {
		return Layer{}, err
	}
	if err := json.Unmarshal([]byte(chain), &l.Chain); err != nil {
		return Layer{}, fmt.Errorf("chain of layer %q: %w", l.ID, err)
	}
	l.Created = fromTS(created)
	return l, nil
}

// SpecStrings returns the distinct strings of the JSON array at path (a
// JSON path such as '$.layers') in the spec of every sandbox not in state
// except. The manager asks it which layers its sandboxes still stack, in
// one query instead of decoding every record.
func (s *Store) SpecStrings(ctx context.Context, path, except string) ([]string, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT DISTINCT j.value FROM sandboxes AS sb, json_each(sb.spec, ?) AS j
		WHERE sb.state != ? AND sb.spec IS NOT NULL AND json_valid(sb.spec) AND j.type = 'text'`, path, except)
	if err != nil {
		return nil, fmt.Errorf("store: spec values: %w", classify(err))
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("store: spec values: %w", classify(err))
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: spec values: %w", classify(err))
	}
	return out, nil
}

// ReassignSandbox is UpdateSandbox that may also change the tenant and
// the creation time: a warm pool's sandbox, made ahead for no tenant, is
// handed to the tenant that claims it and counts as created then. The same
// version check applies.
func (s *Store) ReassignSandbox(ctx context.Context, sb Sandbox) (Sandbox, error) {
	return s.updateSandbox(ctx, sb, true)
}
