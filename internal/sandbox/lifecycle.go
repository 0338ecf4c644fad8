package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/store"
)

// Defaults of the lifecycle timers.
const (
	DefaultIdleTimeout = 5 * time.Minute
	DefaultRetireAfter = 5 * time.Hour
	DefaultArchiveCap  = 256 << 20
)

// Timers is a sandbox's time accounting, kept in the store so that every
// timer survives a daemon restart.
type Timers struct {
	// ActiveUsed is running time before RunningSince; RunningSince is
	// zero unless running. Timeout counts their sum only: time paused or
	// suspended is not used up.
	ActiveUsed   time.Duration `json:"active_used,omitempty"`
	RunningSince time.Time     `json:"running_since,omitzero"`
	SuspendedAt  time.Time     `json:"suspended_at,omitzero"`
	Archive      *Archive      `json:"archive,omitempty"`
}

// Archive is a suspended sandbox's kept writable layer.
type Archive struct {
	Key     string    `json:"key"`
	Size    int64     `json:"size"`
	SHA256  string    `json:"sha256"`
	Bytes   int64     `json:"bytes"` // uncompressed
	Created time.Time `json:"created"`
}

// Used is the running time a sandbox has used at now.
func (t Timers) Used(now time.Time) time.Duration {
	if t.RunningSince.IsZero() {
		return t.ActiveUsed
	}
	return t.ActiveUsed + now.Sub(t.RunningSince)
}

func checkLifecycle(s Spec) error {
	switch {
	case s.Timeout < 0:
		return errdefs.New(errdefs.ErrInvalidArgument, "timeout %v: want ≥ 0", s.Timeout)
	case s.OnTimeout != "" && s.OnTimeout != "destroy" && s.OnTimeout != "suspend":
		return errdefs.New(errdefs.ErrInvalidArgument, "on_timeout %q: want destroy or suspend", s.OnTimeout)
	}
	return nil
}

// retime keeps the running-time account in step with a transition.
func retime(rec *store.Sandbox, from, to State, now time.Time) error {
	var t Timers
	if len(rec.Extra) > 0 {
		if err := json.Unmarshal(rec.Extra, &t); err != nil {
			return fmt.Errorf("sandbox %s: stored timers: %w", rec.ID, err)
		}
	}
	if from == Running && to != Running && !t.RunningSince.IsZero() {
		t.ActiveUsed += now.Sub(t.RunningSince)
		t.RunningSince = time.Time{}
	}
	if to == Running && from != Running {
		t.RunningSince = now.UTC()
	}
	if to == Suspended {
		t.SuspendedAt = now.UTC()
	} else if to != Retired {
		t.SuspendedAt = time.Time{}
	}
	raw, err := json.Marshal(t)
	if err != nil {
		return err
	}
	rec.Extra = raw
	return nil
}

// activity is the in-memory side of idle detection: the last API call and
// the holds of open streams, terminals and transfers.
type activity struct {
	mu    sync.Mutex
	last  map[string]time.Time
	holds map[string]int
}

// Touch records an API call on a sandbox.
func (m *Manager) Touch(id string) {
	m.act.mu.Lock()
	m.act.last[id] = time.Now()
	m.act.mu.Unlock()
}

// Hold marks a sandbox busy (an open stream, terminal or transfer) until
// the returned func is called.
func (m *Manager) Hold(id string) func() {
	m.act.mu.Lock()
	m.act.holds[id]++
	m.act.last[id] = time.Now()
	m.act.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.act.mu.Lock()
			m.act.holds[id]--
			if m.act.holds[id] <= 0 {
				delete(m.act.holds, id)
			}
			m.act.last[id] = time.Now()
			m.act.mu.Unlock()
		})
	}
}

// lastActive is when a sandbox was last seen busy; held counts as now.
func (m *Manager) lastActive(id string, since time.Time) time.Time {
	m.act.mu.Lock()
	defer m.act.mu.Unlock()
	if m.act.holds[id] > 0 {
		return time.Now()
	}
	if t, ok := m.act.last[id]; ok && t.After(since) {
		return t
	}
	return since
}

// transit locks a sandbox for a move to target, which is allowed from the
// states in from; any other state is a TransitionError naming target.
func (m *Manager) transit(ctx context.Context, tenant, id string, target State, from ...State) (store.Sandbox, func(), error) {
	rec, err := m.st.GetSandbox(ctx, tenant, id)
	if err != nil {
		return rec, nil, err
	}
	unlock := m.lock(id)
	rec, err = m.st.GetSandbox(ctx, tenant, id) // fresh, under the lock
	if err != nil {
		unlock()
		return rec, nil, err
	}
	for _, s := range from {
		if State(rec.State) == s {
			return rec, unlock, nil
		}
	}
	unlock()
	return rec, nil, &errdefs.TransitionError{ID: id, From: rec.State, To: string(target)}
}

// Pause freezes every process of a running sandbox; memory stays.
func (m *Manager) Pause(ctx context.Context, tenant, id string) (Sandbox, error) {
	pz, ok := m.be.(backend.Pauser)
	if !ok {
		return Sandbox{}, errdefs.New(errdefs.ErrNotImplemented, "backend %s cannot pause", m.be.Name())
	}
	rec, unlock, err := m.transit(ctx, tenant, id, Paused, Running)
	if err != nil {
		return m.already(ctx, rec, err, Paused)
	}
	defer unlock()
	if err := pz.Pause(ctx, id); err != nil {
		return Sandbox{}, err
	}
	return m.moved(ctx, rec, Paused, "")
}

// already turns a transition refused because the sandbox is already where
// it was asked to go into success: pausing a paused sandbox is no error.
func (m *Manager) already(ctx context.Context, rec store.Sandbox, err error, to State) (Sandbox, error) {
	if State(rec.State) == to {
		return fromRecord(rec)
	}
	return Sandbox{}, err
}

func (m *Manager) moved(ctx context.Context, rec store.Sandbox, to State, reason string) (Sandbox, error) {
	out, err := m.move(ctx, rec, to, reason)
	if err != nil {
		return Sandbox{}, err
	}
	return fromRecord(out)
}

// Resume brings a paused, suspended or retired sandbox back to running.
func (m *Manager) Resume(ctx context.Context, tenant, id string) (Sandbox, error) {
	rec, unlock, err := m.transit(ctx, tenant, id, Running, Paused, Suspended, Retired, Running)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	switch State(rec.State) {
	case Running:
		return fromRecord(rec)
	case Paused:
		if err := m.be.(backend.Pauser).Unpause(ctx, id); err != nil {
			return Sandbox{}, err
		}
		return m.moved(ctx, rec, Running, "")
	}
	return m.restore(ctx, rec)
}

// restore restarts a suspended (or retired) sandbox from its archive.
func (m *Manager) restore(ctx context.Context, rec store.Sandbox) (Sandbox, error) {
	sb, err := fromRecord(rec)
	if err != nil {
		return Sandbox{}, err
	}
	sus, ok := m.be.(backend.Suspender)
	if !ok || m.opts.Blobs == nil || sb.Timers.Archive == nil {
		return Sandbox{}, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %s has no archive to resume from", rec.ID)
	}
	if State(rec.State) == Retired {
		// Its backend sandbox is gone: make it again, empty, to restore into.
		if _, err := m.be.Create(ctx, backendSpec(sb.Spec)); err != nil {
			return Sandbox{}, err
		}
		if err := m.be.Stop(ctx, rec.ID); err != nil {
			return Sandbox{}, err
		}
	}
	r, _, err := m.opts.Blobs.Open(ctx, sb.Timers.Archive.Key)
	if err != nil {
		return Sandbox{}, fmt.Errorf("resume %s: %w", rec.ID, err)
	}
	defer r.Close()
	h, err := sus.Resume(ctx, rec.ID, r)
	if err != nil {
		return Sandbox{}, err
	}
	rec.Handle, _ = json.Marshal(h)
	m.Touch(rec.ID)
	return m.moved(ctx, rec, Running, "")
}

// Suspend keeps a sandbox's whole writable layer as an archive and lets
// its processes and memory go. If the archive cannot be kept (over its
// size cap, say), the sandbox runs on untouched and the error says why.
func (m *Manager) Suspend(ctx context.Context, tenant, id string) (Sandbox, error) {
	rec, unlock, err := m.transit(ctx, tenant, id, Suspended, Running, Paused)
	if err != nil {
		return m.already(ctx, rec, err, Suspended)
	}
	defer unlock()
	return m.suspend(ctx, rec, "")
}

func (m *Manager) suspend(ctx context.Context, rec store.Sandbox, reason string) (Sandbox, error) {
	sus, ok := m.be.(backend.Suspender)
	if !ok || m.opts.Blobs == nil {
		return Sandbox{}, errdefs.New(errdefs.ErrNotImplemented, "backend %s cannot suspend", m.be.Name())
	}
	key := rec.ID + ".tar.zst"
	var out store.Sandbox
	st, err := sus.Suspend(ctx, rec.ID, func(r io.Reader) error {
		bi, err := m.opts.Blobs.Put(ctx, key, r, m.opts.ArchiveCap)
		if err != nil {
			return err
		}
		// Recorded before the backend lets the processes and the upper
		// go: a daemon killed after this point finds a suspended sandbox
		// with its archive, never a running one with nothing left.
		var t Timers
		_ = json.Unmarshal(rec.Extra, &t)
		t.Archive = &Archive{Key: key, Size: bi.Size, SHA256: bi.SHA256, Bytes: bi.Size, Created: bi.Created}
		rec.Extra, _ = json.Marshal(t)
		out, err = m.move(ctx, rec, Suspended, reason)
		return err
	})
	if err != nil {
		if out.ID != "" {
			m.log.Error("suspend: archive kept but releasing the sandbox failed", "id", rec.ID, "err", err)
		}
		return Sandbox{}, err
	}
	// Only now is the uncompressed size known.
	var t Timers
	if json.Unmarshal(out.Extra, &t) == nil && t.Archive != nil {
		t.Archive.Bytes = st.Bytes
		out.Extra, _ = json.Marshal(t)
		if updated, err := m.st.UpdateSandbox(context.WithoutCancel(ctx), out); err == nil {
			out = updated
		}
	}
	return fromRecord(out)
}

// Patch changes a sandbox's timers live. Nil fields stay as they are.
type Patch struct {
	Timeout      *time.Duration
	OnTimeout    *string
	IdleTimeout  *time.Duration
	RetireAfter  *time.Duration
	NoAutoResume *bool
}

// Update applies p. A new timeout counts from creation, in running time;
// raising it extends a sandbox, and one already past it is reaped.
func (m *Manager) Update(ctx context.Context, tenant, id string, p Patch) (Sandbox, error) {
	rec, err := m.st.GetSandbox(ctx, tenant, id)
	if err != nil {
		return Sandbox{}, err
	}
	unlock := m.lock(id)
	defer unlock()
	if rec, err = m.st.GetSandbox(ctx, tenant, id); err != nil {
		return Sandbox{}, err
	}
	if State(rec.State) == Destroyed {
		return Sandbox{}, &errdefs.TransitionError{ID: id, From: rec.State, To: "updated"}
	}
	sb, err := fromRecord(rec)
	if err != nil {
		return Sandbox{}, err
	}
	applyPatch(&sb.Spec, p)
	if err := checkLifecycle(sb.Spec); err != nil {
		return Sandbox{}, err
	}
	rec.Spec, _ = json.Marshal(sb.Spec)
	out, err := m.st.UpdateSandbox(ctx, rec)
	if err != nil {
		return Sandbox{}, err
	}
	m.Touch(id)
	return fromRecord(out)
}

func applyPatch(s *Spec, p Patch) {
	if p.Timeout != nil {
		s.Timeout = *p.Timeout
	}
	if p.OnTimeout != nil {
		s.OnTimeout = *p.OnTimeout
	}
	if p.IdleTimeout != nil {
		s.IdleTimeout = *p.IdleTimeout
	}
	if p.RetireAfter != nil {
		s.RetireAfter = *p.RetireAfter
	}
	if p.NoAutoResume != nil {
		s.NoAutoResume = *p.NoAutoResume
	}
}

// OpenArchive reads a suspended or retired sandbox's archive.
func (m *Manager) OpenArchive(ctx context.Context, tenant, id string) (io.ReadCloser, Archive, error) {
	sb, err := m.Get(ctx, tenant, id)
	if err != nil {
		return nil, Archive{}, err
	}
	if sb.Timers.Archive == nil || m.opts.Blobs == nil || sb.State == Destroyed {
		return nil, Archive{}, errdefs.New(errdefs.ErrNotFound, "sandbox %s has no archive (it was never suspended, or it was destroyed)", id)
	}
	r, _, err := m.opts.Blobs.Open(ctx, sb.Timers.Archive.Key)
	return r, *sb.Timers.Archive, err
}

// createFromArchive makes a new sandbox whose files are those of another
// sandbox's archive (a suspended or retired one, or one suspended before),
// over the same base and layers; no processes come along.
func (m *Manager) createFromArchive(ctx context.Context, tenant string, spec Spec) (Sandbox, error) {
	if spec.Template != "" || spec.Base != "" {
		return Sandbox{}, errdefs.New(errdefs.ErrInvalidArgument, "from_archive takes the source's base and template; give neither")
	}
	src, err := m.Get(ctx, tenant, spec.FromArchive)
	if err != nil {
		return Sandbox{}, err
	}
	if src.Timers.Archive == nil || src.State == Destroyed {
		return Sandbox{}, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %s has no archive to start from (suspend it first)", src.ID)
	}
	spec.Base, spec.Layers, spec.Generation = src.Spec.Base, src.Spec.Layers, src.Spec.Generation
	return m.create(ctx, tenant, spec, src.Timers.Archive)
}

// restoreArchive replaces a just-made sandbox's empty writable layer with
// an archive's: stop it, unpack, start it again.
func (m *Manager) restoreArchive(ctx context.Context, id string, a *Archive) (backend.Handle, error) {
	sus, ok := m.be.(backend.Suspender)
	if !ok || m.opts.Blobs == nil {
		return backend.Handle{}, errdefs.New(errdefs.ErrNotImplemented, "backend %s cannot restore archives", m.be.Name())
	}
	if err := m.be.Stop(ctx, id); err != nil {
		return backend.Handle{}, err
	}
	r, _, err := m.opts.Blobs.Open(ctx, a.Key)
	if err != nil {
		return backend.Handle{}, err
	}
	defer r.Close()
	return sus.Resume(ctx, id, r)
}
