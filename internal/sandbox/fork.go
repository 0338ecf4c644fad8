package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/store"
)

// Snapshot and fork freeze a running sandbox's filesystem (its writable
// layer, processes frozen meanwhile, then running on) into a new layer
// that stacks over the sandbox's own base and layers. A snapshot becomes a
// template's generation; a fork starts new sandboxes from it at once. No
// process crosses: the new sandboxes start with a fresh init.

// ForkOptions describe the sandboxes a fork makes.
type ForkOptions struct {
	Count    int // default 1, at most MaxFork
	Labels   map[string]string
	Metadata map[string]string
}

// Snapshot freezes tenant's sandbox id into a new generation of tenant's
// template name, creating the template if needed. A template with a
// recipe is not replaced by a snapshot (conflict). Sandboxes made from the
// template's earlier snapshot keep theirs.
func (m *Manager) Snapshot(ctx context.Context, tenant, id, name string) (Template, error) {
	if err := m.needTemplates(); err != nil {
		return Template{}, err
	}
	if err := checkTemplateName(name); err != nil {
		return Template{}, err
	}
	if _, err := m.st.GetSandbox(ctx, tenant, id); err != nil {
		return Template{}, err // before the template is looked at: another tenant's sandbox is 404 first
	}
	unlock := m.templateLock(tenant, name)
	defer unlock()
	old, err := m.st.GetTemplate(ctx, tenant, name)
	switch {
	case err == nil:
		def, derr := decodeDef(old)
		if derr != nil {
			return Template{}, derr
		}
		if def.Snapshot == nil {
			return Template{}, errdefs.New(errdefs.ErrConflict, "template %q is built from a recipe; snapshot into another name", name)
		}
	case !errors.Is(err, errdefs.ErrNotFound):
		return Template{}, err
	}
	src, l, unpin, err := m.snapshotLayer(ctx, tenant, id, "snapshot", name)
	if err != nil {
		return Template{}, err
	}
	defer unpin()
	def := TemplateDef{Base: src.Spec.Base, Env: src.Spec.Env, Cwd: src.Spec.Cwd, Limits: src.Spec.Limits,
		Snapshot: &SnapshotSource{Sandbox: id, Taken: time.Now().UTC()}}
	raw, err := json.Marshal(def)
	if err != nil {
		return Template{}, err
	}
	build, _ := json.Marshal(BuildStatus{State: TemplateReady, Generation: l.ID, At: time.Now().UTC()})
	rec, err := m.st.PutTemplate(ctx, store.Template{Tenant: tenant, Name: name, Spec: raw, Generation: l.ID,
		PoolSize: old.PoolSize, Build: build})
	if err != nil {
		return Template{}, err
	}
	m.kickTemplates() // the pool takes the new generation; the old one may go
	return m.view(rec)
}

// Fork makes o.Count new sandboxes of tenant that start from sandbox id's
// filesystem as it is now (no processes), with its settings and o's labels
// and metadata. Either all are made or none is.
func (m *Manager) Fork(ctx context.Context, tenant, id string, o ForkOptions) ([]Sandbox, error) {
	if err := m.needTemplates(); err != nil {
		return nil, err
	}
	if o.Count == 0 {
		o.Count = 1
	}
	if o.Count < 1 || o.Count > MaxFork {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "count %d: want 1 to %d", o.Count, MaxFork)
	}
	src, l, unpin, err := m.snapshotLayer(ctx, tenant, id, "fork", "")
	if err != nil {
		return nil, err
	}
	defer unpin()
	s := src.Spec
	base := Spec{Base: s.Base, Layers: m.layerPaths(l.Chain), Env: s.Env, Cwd: s.Cwd, Limits: s.Limits,
		Template: s.Template, Generation: s.Generation, ForkOf: id, Labels: o.Labels, Metadata: o.Metadata,
		Timeout: s.Timeout, OnTimeout: s.OnTimeout, IdleTimeout: s.IdleTimeout, RetireAfter: s.RetireAfter,
		NoAutoResume: s.NoAutoResume, Network: s.Network}
	if s.Pool != nil {
		base.IdleTimeout = 0 // a pooled sandbox's "never" is the pool's, not the fork's
	}
	out := make([]Sandbox, 0, o.Count)
	for range o.Count {
		sb, err := m.create(ctx, tenant, base, nil)
		if err != nil {
			for _, made := range out {
				_ = m.Delete(context.WithoutCancel(ctx), tenant, made.ID)
			}
			m.kickTemplates()
			return nil, fmt.Errorf("fork %s: %w", id, err)
		}
		out = append(out, sb)
	}
	return out, nil
}

// snapshotLayer freezes a running (or paused) sandbox of tenant into a new
// layer recorded as a generation of kind, pinned until unpin. A suspended
// sandbox is resumed first, as for any call (unless it opted out).
func (m *Manager) snapshotLayer(ctx context.Context, tenant, id, kind, tmpl string) (Sandbox, store.Layer, func(), error) {
	if _, err := m.Live(ctx, tenant, id); err != nil {
		return Sandbox{}, store.Layer{}, nil, err
	}
	unlock := m.lock(id)
	defer unlock()
	rec, err := m.st.GetSandbox(ctx, tenant, id)
	if err != nil {
		return Sandbox{}, store.Layer{}, nil, err
	}
	sb, err := fromRecord(rec)
	if err != nil {
		return Sandbox{}, store.Layer{}, nil, err
	}
	if sb.State != Running && sb.State != Paused {
		return Sandbox{}, store.Layer{}, nil, &errdefs.TransitionError{ID: id, From: string(sb.State), To: string(Running)}
	}
	var chain []string
	for _, p := range sb.Spec.Layers {
		if filepath.Dir(p) != m.tpl.dir {
			return Sandbox{}, store.Layer{}, nil, errdefs.New(errdefs.ErrFailedPrecondition,
				"sandbox %s stacks a layer outside the layer directory (%s)", id, p)
		}
		chain = append(chain, filepath.Base(p))
	}
	dir, st, err := m.freeze(ctx, id)
	if err != nil {
		return Sandbox{}, store.Layer{}, nil, fmt.Errorf("%s %s: %w", kind, id, m.CheckAlive(ctx, id, err))
	}
	chain = append(chain, dir)
	m.tpl.mu.Lock()
	unpin := m.pinLocked(chain)
	m.tpl.mu.Unlock()
	prefix := map[string]string{"snapshot": "s-", "fork": "f-"}[kind]
	l := store.Layer{ID: prefix + randHex(16), Tenant: tenant, Dir: dir, Template: tmpl, Kind: kind,
		Base: sb.Spec.Base, Chain: chain, Bytes: st.Bytes, Files: st.Files}
	if err := m.st.PutLayer(context.WithoutCancel(ctx), l); err != nil {
		unpin()
		_ = os.RemoveAll(filepath.Join(m.tpl.dir, dir))
		return Sandbox{}, store.Layer{}, nil, err
	}
	m.Touch(id)
	return sb, l, unpin, nil
}
