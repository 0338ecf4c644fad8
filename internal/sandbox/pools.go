package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"time"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/store"
)

// A warm pool keeps a template's sandboxes made ahead: created, running,
// and owned by no tenant (their records belong to tenant "" and carry a
// PoolRef). A create from the template that asks for nothing they lack
// takes one in O(1) — it is re-labelled and handed to the tenant — and the
// pool refills in the background. Pool sizes are stored with the
// templates, and pooled sandboxes are ordinary records, so both survive a
// restart: recovery re-adopts the sandboxes and New re-adopts them into
// their pools. Pooled sandboxes are never idle-suspended (IdleTimeout -1
// until claimed).

// PoolLabel is the label a pooled sandbox carries until it is claimed: the
// name of its template.
const PoolLabel = "hutch.pool"

// refillDelay is how long a claim waits before starting its refill.
const refillDelay = 25 * time.Millisecond

// poolRetry is how long a pool whose refill failed waits before trying
// again (a failing build, say).
const poolRetry = 30 * time.Second

// PoolRef marks a pooled sandbox: whose template's pool it is in.
type PoolRef struct {
	Tenant   string `json:"tenant"`
	Template string `json:"template"`
}

type poolKey struct{ tenant, name string }

type pooled struct{ id, gen string }

// SetPool sets how many ready sandboxes tenant's template name keeps.
// Shrinking destroys the extra ones before it returns; growing fills the
// pool in the background.
func (m *Manager) SetPool(ctx context.Context, tenant, name string, size int) (Template, error) {
	if err := m.needTemplates(); err != nil {
		return Template{}, err
	}
	if size < 0 || size > m.opts.MaxPool {
		return Template{}, errdefs.New(errdefs.ErrInvalidArgument, "pool size %d: want 0 to %d", size, m.opts.MaxPool)
	}
	unlock := m.templateLock(tenant, name)
	rec, err := m.st.GetTemplate(ctx, tenant, name)
	if err == nil {
		rec.PoolSize = size
		rec, err = m.st.PutTemplate(ctx, rec)
	}
	unlock()
	if err != nil {
		return Template{}, err
	}
	m.setPoolSize(poolKey{tenant, name}, size)
	m.trimPool(ctx, poolKey{tenant, name}, size, "")
	m.kickTemplates()
	return m.view(rec)
}

// poolable reports whether a create may take a pooled sandbox: it asks for
// nothing fixed at start (id, hostname, env, cwd, limits) that differs from
// the template's.
func poolable(req Spec, def TemplateDef) bool {
	if req.ID != "" || req.Hostname != "" || (req.Cwd != "" && req.Cwd != def.Cwd) {
		return false
	}
	for k, v := range req.Env {
		if dv, ok := def.Env[k]; !ok || dv != v {
			return false
		}
	}
	l, d := req.Limits, def.Limits
	return (l.MemoryBytes == 0 || l.MemoryBytes == d.MemoryBytes) && (l.CPUMillis == 0 || l.CPUMillis == d.CPUMillis) &&
		(l.Pids == 0 || l.Pids == d.Pids)
}

// claim hands a ready sandbox of key's pool, of generation gen, to tenant
// with req's labels, metadata and timers. false: none was ready.
func (m *Manager) claim(ctx context.Context, tenant string, key poolKey, gen string, req Spec) (Sandbox, bool) {
	for {
		id, ok := m.popReady(key, gen)
		if !ok {
			return Sandbox{}, false
		}
		sb, err := m.handOver(ctx, tenant, id, key, req)
		// Refill soon, not now: making the replacement at once would take
		// the cores from the sandbox just handed over, in its first
		// milliseconds, which are what its caller is waiting on.
		time.AfterFunc(refillDelay, m.kickTemplates)
		if err == nil {
			return sb, true
		}
		m.log.Warn("pooled sandbox could not be claimed", "id", id, "err", err)
		if errors.Is(err, errPoolDead) {
			_ = m.Delete(context.WithoutCancel(ctx), "", id)
		}
	}
}

func (m *Manager) popReady(key poolKey, gen string) (string, bool) {
	t := m.tpl
	t.mu.Lock()
	defer t.mu.Unlock()
	list := t.ready[key]
	for i := len(list) - 1; i >= 0; i-- {
		if list[i].gen == gen {
			id := list[i].id
			t.ready[key] = append(list[:i:i], list[i+1:]...)
			return id, true
		}
	}
	return "", false
}

var errPoolDead = errors.New("pooled sandbox is not running")

// handOver re-owns a pooled sandbox: tenant, labels, metadata, timers; its
// running time starts now, and it counts as created now.
func (m *Manager) handOver(ctx context.Context, tenant, id string, key poolKey, req Spec) (Sandbox, error) {
	if err := checkLifecycle(req); err != nil {
		return Sandbox{}, err
	}
	unlock := m.lock(id)
	defer unlock()
	rec, err := m.st.GetSandbox(ctx, "", id)
	if err != nil {
		return Sandbox{}, err
	}
	sb, err := fromRecord(rec)
	if err != nil {
		return Sandbox{}, err
	}
	if sb.State != Running || sb.Spec.Pool == nil || *sb.Spec.Pool != (PoolRef{key.tenant, key.name}) {
		return Sandbox{}, errPoolDead
	}
	if info, err := m.be.Inspect(ctx, id); err != nil || info.Status != backend.StatusRunning {
		return Sandbox{}, errPoolDead
	}
	spec := sb.Spec
	spec.Pool = nil
	spec.Labels, spec.Metadata = req.Labels, req.Metadata
	spec.Timeout, spec.OnTimeout, spec.IdleTimeout = req.Timeout, req.OnTimeout, req.IdleTimeout
	spec.RetireAfter, spec.NoAutoResume = req.RetireAfter, req.NoAutoResume
	spec.Network, spec.Ports = req.Network, req.Ports
	rec.Tenant, rec.Labels, rec.Metadata = tenant, req.Labels, req.Metadata
	if rec.Spec, err = json.Marshal(spec); err != nil {
		return Sandbox{}, err
	}
	rec.Extra, _ = json.Marshal(Timers{RunningSince: time.Now().UTC()})
	if err := m.netUp(ctx, rec); err != nil {
		return Sandbox{}, err
	}
	out, err := m.st.ReassignSandbox(context.WithoutCancel(ctx), rec)
	if err != nil {
		m.netDown(id)
		return Sandbox{}, err
	}
	m.Touch(id)
	return fromRecord(out)
}

// adoptPools loads the pool sizes and puts the pooled sandboxes recovery
// found running back into their pools. Failed ones belong to nobody and
// are destroyed.
func (m *Manager) adoptPools(ctx context.Context) error {
	tmpls, err := m.st.ListTemplates(ctx, "", true)
	if err != nil {
		return err
	}
	for _, t := range tmpls {
		if t.PoolSize > 0 {
			m.tpl.sizes[poolKey{t.Tenant, t.Name}] = t.PoolSize
		}
	}
	for token := ""; ; {
		recs, next, err := m.st.ListSandboxes(ctx, store.ListFilter{Tenant: "",
			States: []string{string(Running), string(Failed)}, Limit: 1000, PageToken: token})
		if err != nil {
			return err
		}
		for _, rec := range recs {
			sb, err := fromRecord(rec)
			if err != nil || sb.Spec.Pool == nil || rec.Tenant != "" {
				continue
			}
			if sb.State == Failed {
				_ = m.Delete(ctx, "", sb.ID)
				continue
			}
			key := poolKey{sb.Spec.Pool.Tenant, sb.Spec.Pool.Template}
			m.tpl.ready[key] = append(m.tpl.ready[key], pooled{id: sb.ID, gen: sb.Spec.Generation})
		}
		if token = next; token == "" {
			return nil
		}
	}
}

// reconcilePools brings every pool to its size with sandboxes of its
// template's current generation, and empties the pools of templates gone.
func (m *Manager) reconcilePools(ctx context.Context) {
	m.tpl.mu.Lock()
	want := maps.Clone(m.tpl.sizes)
	var orphans []poolKey
	for k := range m.tpl.ready {
		if _, ok := want[k]; !ok {
			orphans = append(orphans, k)
		}
	}
	m.tpl.mu.Unlock()
	for _, k := range orphans {
		m.trimPool(ctx, k, 0, "")
	}
	for k := range want {
		if ctx.Err() != nil {
			return
		}
		m.fillPool(ctx, k)
	}
}

func (m *Manager) fillPool(ctx context.Context, key poolKey) {
	m.tpl.mu.Lock()
	failedAt, failed := m.tpl.failed[key]
	m.tpl.mu.Unlock()
	if failed && time.Since(failedAt) < poolRetry {
		return
	}
	fail := func(what string, err error) {
		if ctx.Err() != nil || errors.Is(err, errdefs.ErrNotFound) {
			return // stopping, or the template went meanwhile
		}
		m.log.Warn("warm pool: "+what, "tenant", key.tenant, "template", key.name, "err", err)
		m.tpl.mu.Lock()
		m.tpl.failed[key] = time.Now()
		m.tpl.mu.Unlock()
	}
	rec, l, unpin, _, err := m.ensureBuilt(ctx, key.tenant, key.name, nil)
	if err != nil {
		fail("build", err)
		return
	}
	defer unpin()
	def, err := decodeDef(rec)
	if err != nil {
		fail("definition", err)
		return
	}
	m.tpl.mu.Lock()
	size := m.tpl.sizes[key]
	m.tpl.mu.Unlock()
	m.trimPool(ctx, key, size, l.ID) // stale generations and dead ones go
	for m.poolShort(key) && ctx.Err() == nil {
		spec := Spec{Base: def.Base, Layers: m.layerPaths(l.Chain), Generation: l.ID, Env: def.Env, Cwd: def.Cwd,
			Limits: def.Limits, Template: key.name, IdleTimeout: -1, Labels: map[string]string{PoolLabel: key.name},
			Pool: &PoolRef{Tenant: key.tenant, Template: key.name}}
		sb, err := m.create(ctx, "", spec, nil)
		if err != nil {
			fail("create", err)
			return
		}
		m.warmUp(ctx, sb.ID)
		if !m.addPooled(key, pooled{id: sb.ID, gen: l.ID}) {
			_ = m.Delete(context.WithoutCancel(ctx), "", sb.ID)
		}
	}
	m.tpl.mu.Lock()
	delete(m.tpl.failed, key)
	m.tpl.mu.Unlock()
}

// warmUp runs one `true` in a new pooled sandbox, so that the first
// command of whoever claims it is not its agent's first fork (page faults
// in init and the shell are paid here, off the claim path).
func (m *Manager) warmUp(ctx context.Context, id string) {
	p, err := m.be.Exec(ctx, id, backend.ExecRequest{Cmd: "true"})
	if err != nil {
		return
	}
	_, _ = backend.Wait(p, nil, nil)
	p.Close()
}

// setPoolSize records the size key's pool should have; a new size is a
// new try for a pool whose refill failed.
func (m *Manager) setPoolSize(key poolKey, size int) {
	m.tpl.mu.Lock()
	defer m.tpl.mu.Unlock()
	if size > 0 {
		m.tpl.sizes[key] = size
	} else {
		delete(m.tpl.sizes, key)
	}
	delete(m.tpl.failed, key)
}

// poolShort reports whether key's pool has fewer ready sandboxes than it
// should.
func (m *Manager) poolShort(key poolKey) bool {
	m.tpl.mu.Lock()
	defer m.tpl.mu.Unlock()
	return len(m.tpl.ready[key]) < m.tpl.sizes[key]
}

// addPooled puts a new sandbox in key's pool, unless the pool shrank (or
// went) while it was made: then it reports false and the caller destroys it.
func (m *Manager) addPooled(key poolKey, p pooled) bool {
	m.tpl.mu.Lock()
	defer m.tpl.mu.Unlock()
	if len(m.tpl.ready[key]) >= m.tpl.sizes[key] {
		return false
	}
	m.tpl.ready[key] = append(m.tpl.ready[key], p)
	return true
}

// trimPool destroys key's pooled sandboxes beyond size, those not of
// generation gen (when gen is set), and forgets those no longer running.
func (m *Manager) trimPool(ctx context.Context, key poolKey, size int, gen string) {
	m.tpl.mu.Lock()
	list := m.tpl.ready[key]
	var keep, drop []pooled
	for _, p := range list {
		if (gen != "" && p.gen != gen) || !m.poolAlive(ctx, p.id) {
			drop = append(drop, p)
		} else {
			keep = append(keep, p)
		}
	}
	if len(keep) > size {
		drop, keep = append(drop, keep[size:]...), keep[:size]
	}
	if len(keep) == 0 {
		delete(m.tpl.ready, key)
	} else {
		m.tpl.ready[key] = keep
	}
	m.tpl.mu.Unlock()
	for _, p := range drop {
		if err := m.Delete(context.WithoutCancel(ctx), "", p.id); err != nil {
			m.log.Warn("warm pool: destroy", "id", p.id, "err", err)
		}
	}
}

// poolAlive reports whether a pooled sandbox is still running unclaimed.
func (m *Manager) poolAlive(ctx context.Context, id string) bool {
	rec, err := m.st.GetSandbox(ctx, "", id)
	if err != nil || State(rec.State) != Running || rec.Tenant != "" {
		return false
	}
	info, err := m.be.Inspect(ctx, id)
	return err == nil && info.Status == backend.StatusRunning
}
