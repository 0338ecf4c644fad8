// Package sandbox is the manager: the one place that owns a sandbox's
// state. It keeps records in the store, drives a backend through the
// transitions of one state machine, recovers every sandbox after a daemon
// restart, and enforces time limits. Servers and other front ends call the
// manager; nothing below it knows about tenants or HTTP.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/blob"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/netpolicy"
	"github.com/hutch-dev/hutch/internal/store"
)

// State is where a sandbox is in its life.
type State string

// The states. Every transition goes through Manager.transition.
const (
	Creating  State = "creating"
	Running   State = "running"
	Paused    State = "paused"
	Suspended State = "suspended"
	Retired   State = "retired"
	Destroyed State = "destroyed"
	Failed    State = "failed"
)

// transitions lists the allowed state changes.
var transitions = map[State][]State{
	Creating:  {Running, Failed, Destroyed},
	Running:   {Paused, Suspended, Failed, Destroyed},
	Paused:    {Running, Suspended, Failed, Destroyed},
	Suspended: {Running, Retired, Failed, Destroyed},
	Retired:   {Running, Destroyed},
	Failed:    {Destroyed},
	Destroyed: {},
}

func canMove(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Options tune the manager.
type Options struct {
	Logger *slog.Logger
	// ReapInterval is how often time limits are checked (default 1s).
	ReapInterval time.Duration
	// OnTransition, when set, is told of every state change (metrics).
	OnTransition func(from, to State)
	// Blobs keeps suspended sandboxes' archives (nil: no suspend).
	Blobs blob.Store
	// ArchiveCap bounds one archive, compressed (default 256 MiB).
	ArchiveCap int64
	// LayerDir holds template, snapshot and fork layers (DATA/layers);
	// empty: no templates, snapshots or forks.
	LayerDir string
	// PoolInterval is how often warm pools are refilled and unused layers
	// collected (default 2s); both also happen when something changes.
	PoolInterval time.Duration
	// BuildTimeout bounds one template build (default 30 min).
	BuildTimeout time.Duration
	// MaxPool bounds a template's warm pool (default 32).
	MaxPool int
	// Network enforces network policies; nil: every sandbox is deny-all
	// and asking for more is refused.
	Network Network
}

// Manager owns sandboxes.
type Manager struct {
	st   *store.Store
	be   backend.Backend
	opts Options
	log  *slog.Logger

	mu    sync.Mutex
	locks map[string]*sync.Mutex
	act   activity
	tpl   *templates // nil without a LayerDir

	stop func()
	done chan struct{}
}

// Spec is what a caller asks for when creating a sandbox.
type Spec struct {
	ID       string            `json:"id,omitempty"`
	Base     string            `json:"base,omitempty"`
	Template string            `json:"template,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	Hostname string            `json:"hostname,omitempty"`
	Limits   backend.Limits    `json:"limits"`
	Labels   map[string]string `json:"labels,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Timeout is a hard limit on the sandbox's running time (0: none);
	// time paused or suspended does not count. When it is reached the
	// sandbox is destroyed, or suspended if OnTimeout is "suspend".
	Timeout   time.Duration `json:"timeout,omitempty"`
	OnTimeout string        `json:"on_timeout,omitempty"`
	// IdleTimeout suspends a sandbox idle this long (0: the default, 5
	// min; negative: never). Idle means no process but init, no open
	// stream, terminal or transfer, and no API call.
	IdleTimeout time.Duration `json:"idle_timeout,omitempty"`
	// RetireAfter retires a sandbox suspended this long (0: the default,
	// 5 h; negative: never): its archive is kept, nothing else.
	RetireAfter time.Duration `json:"retire_after,omitempty"`
	// NoAutoResume makes calls on a paused or suspended sandbox fail with
	// a conflict instead of resuming it first.
	NoAutoResume bool `json:"no_auto_resume,omitempty"`
	// FromArchive names a sandbox (of the same tenant) whose archive the
	// new one starts from: its files, over the same base and layers.
	FromArchive string `json:"from_archive,omitempty"`
	// Layers are the read-only layer directories stacked on the base,
	// lowest first: a template's generation, a fork's snapshot. The
	// manager sets them; they keep their layers from being collected.
	Layers []string `json:"layers,omitempty"`
	// Generation is the template generation the sandbox was made from.
	Generation string `json:"generation,omitempty"`
	// ForkOf names the sandbox this one was forked from.
	ForkOf string `json:"fork_of,omitempty"`
	// Pool marks a sandbox kept ready in a warm pool: it belongs to no
	// tenant until a create claims it.
	Pool *PoolRef `json:"pool,omitempty"`
	// Network is the sandbox's network policy (nil: deny-all). It holds
	// credential values: show it only through Redacted.
	Network *netpolicy.Policy `json:"network,omitempty"`
	// Ports are the sandbox's ports exposed through the daemon.
	Ports []ExposedPort `json:"ports,omitempty"`
}

// Sandbox is the manager's view of one sandbox.
type Sandbox struct {
	ID      string
	Tenant  string
	State   State
	Reason  string
	Spec    Spec
	Timers  Timers
	Created time.Time
	Updated time.Time
}

// New makes a manager over a store and a backend, recovers every sandbox
// the store knows, and starts the time-limit reaper. Close stops it.
func New(ctx context.Context, st *store.Store, be backend.Backend, opts Options) (*Manager, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ReapInterval == 0 {
		opts.ReapInterval = time.Second
	}
	if opts.ArchiveCap == 0 {
		opts.ArchiveCap = DefaultArchiveCap
	}
	m := &Manager{st: st, be: be, opts: opts, log: opts.Logger, locks: map[string]*sync.Mutex{},
		act: activity{last: map[string]time.Time{}, holds: map[string]int{}}}
	if err := m.recoverAll(ctx); err != nil {
		return nil, err
	}
	if err := m.startTemplates(ctx); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	m.stop, m.done = cancel, make(chan struct{})
	go m.reaper(rctx)
	return m, nil
}

// Close stops the reaper, the pools' refiller and any template build.
// Sandboxes keep running, pooled ones too.
func (m *Manager) Close() error {
	m.stop()
	<-m.done
	m.stopTemplates()
	return nil
}

// Backend is the backend the manager drives.
func (m *Manager) Backend() backend.Backend { return m.be }

func (m *Manager) lock(id string) func() {
	m.mu.Lock()
	l := m.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		m.locks[id] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// NewID returns a fresh sandbox id.
func NewID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "sbx-" + hex.EncodeToString(b)
}

// Create records and starts a sandbox for tenant. On failure nothing is
// left: the record goes with the half-made sandbox.
func (m *Manager) Create(ctx context.Context, tenant string, spec Spec) (Sandbox, error) {
	if _, err := m.compilePolicy(spec.Network); err != nil {
		return Sandbox{}, err
	}
	if spec.FromArchive != "" {
		return m.createFromArchive(ctx, tenant, spec)
	}
	if spec.Template != "" {
		return m.createFromTemplate(ctx, tenant, spec)
	}
	return m.create(ctx, tenant, spec, nil)
}

// create makes a sandbox; with restore, its writable layer is that
// archive's instead of an empty one.
func (m *Manager) create(ctx context.Context, tenant string, spec Spec, restore *Archive) (Sandbox, error) {
	if spec.ID == "" {
		spec.ID = NewID()
	}
	if err := checkLifecycle(spec); err != nil {
		return Sandbox{}, err
	}
	unlock := m.lock(spec.ID)
	defer unlock()
	rec, err := m.insert(ctx, tenant, spec)
	if err != nil {
		return Sandbox{}, err
	}
	m.notify("", Creating)
	h, err := m.be.Create(ctx, backendSpec(spec))
	if err == nil && restore != nil {
		if h, err = m.restoreArchive(ctx, spec.ID, restore); err != nil {
			_ = m.be.Destroy(context.WithoutCancel(ctx), spec.ID)
		}
	}
	if err != nil {
		m.dropCreate(ctx, spec.ID, Creating)
		return Sandbox{}, err
	}
	rec.Handle, _ = json.Marshal(h)
	moved, err := m.move(ctx, rec, Running, "")
	if err != nil {
		_ = m.be.Destroy(context.WithoutCancel(ctx), spec.ID)
		m.dropCreate(ctx, spec.ID, Creating)
		return Sandbox{}, err
	}
	if ctx.Err() != nil {
		// The caller went away while the sandbox was made: nobody knows
		// its id (it may be a generated one), so keep nothing.
		_ = m.be.Destroy(context.WithoutCancel(ctx), spec.ID)
		m.dropCreate(ctx, spec.ID, Running)
		return Sandbox{}, fmt.Errorf("create %s: the request ended first (%v): %w", spec.ID, ctx.Err(), errdefs.ErrDeadlineExceeded)
	}
	return fromRecord(moved)
}

// dropCreate forgets the record of a create that did not complete.
func (m *Manager) dropCreate(ctx context.Context, id string, state State) {
	if err := m.st.DeleteSandbox(context.WithoutCancel(ctx), id); err != nil {
		m.log.Error("drop record of failed create", "id", id, "err", err)
	}
	m.notify(state, "")
}

func (m *Manager) insert(ctx context.Context, tenant string, spec Spec) (store.Sandbox, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return store.Sandbox{}, err
	}
	exRaw, _ := json.Marshal(Timers{})
	return m.st.InsertSandbox(ctx, store.Sandbox{ID: spec.ID, Tenant: tenant, State: string(Creating),
		Spec: raw, Extra: exRaw, Labels: spec.Labels, Metadata: spec.Metadata})
}

func backendSpec(s Spec) backend.Spec {
	return backend.Spec{ID: s.ID, Base: s.Base, Layers: s.Layers, Env: s.Env, Cwd: s.Cwd, Hostname: s.Hostname, Limits: s.Limits}
}

// move records a transition, refusing one the state machine forbids.
func (m *Manager) move(ctx context.Context, rec store.Sandbox, to State, reason string) (store.Sandbox, error) {
	from := State(rec.State)
	if from != to && !canMove(from, to) {
		return rec, &errdefs.TransitionError{ID: rec.ID, From: string(from), To: string(to)}
	}
	if to == Running && from != Running && from != Paused {
		// A new init: give it its network. A create fails without it; a
		// resume runs on with none (closed) and says so in the log.
		if err := m.netUp(ctx, rec); err != nil {
			if from == Creating {
				return rec, err
			}
			m.log.Error("sandbox resumed without its network", "id", rec.ID, "err", err)
		}
	}
	rec.State, rec.Reason = string(to), reason
	if err := retime(&rec, from, to, time.Now()); err != nil {
		return rec, err
	}
	out, err := m.st.UpdateSandbox(context.WithoutCancel(ctx), rec)
	if err == nil && from != to {
		m.notify(from, to)
		switch to {
		case Suspended, Retired, Destroyed, Failed:
			m.netDown(rec.ID)
		}
	}
	return out, err
}

func (m *Manager) notify(from, to State) {
	if m.opts.OnTransition != nil {
		m.opts.OnTransition(from, to)
	}
}

// Get returns a sandbox of tenant ("" = any tenant).
func (m *Manager) Get(ctx context.Context, tenant, id string) (Sandbox, error) {
	rec, err := m.st.GetSandbox(ctx, tenant, id)
	if err != nil {
		return Sandbox{}, err
	}
	return fromRecord(rec)
}

// ListOptions filter a listing.
type ListOptions struct {
	States    []State
	Labels    map[string]string
	Limit     int
	PageToken string
}

// List lists tenant's sandboxes.
func (m *Manager) List(ctx context.Context, tenant string, o ListOptions) ([]Sandbox, string, error) {
	states := make([]string, len(o.States))
	for i, s := range o.States {
		if _, ok := transitions[s]; !ok {
			return nil, "", fmt.Errorf("state %q: %w", s, errdefs.ErrInvalidArgument)
		}
		states[i] = string(s)
	}
	recs, next, err := m.st.ListSandboxes(ctx, store.ListFilter{Tenant: tenant, States: states,
		Labels: o.Labels, Limit: o.Limit, PageToken: o.PageToken})
	if err != nil {
		return nil, "", err
	}
	out := make([]Sandbox, 0, len(recs))
	for _, r := range recs {
		sb, err := fromRecord(r)
		if err != nil {
			return nil, "", err
		}
		out = append(out, sb)
	}
	return out, next, nil
}

// Delete destroys a sandbox. Deleting one already destroyed succeeds.
func (m *Manager) Delete(ctx context.Context, tenant, id string) error {
	return m.DeleteBecause(ctx, tenant, id, "")
}

// DeleteBecause is Delete with the caller's reason kept in the record
// ("deleted: REASON"): at most 200 printable characters.
func (m *Manager) DeleteBecause(ctx context.Context, tenant, id, why string) error {
	reason := "deleted"
	if why != "" {
		if len(why) > 200 || strings.IndexFunc(why, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			return errdefs.New(errdefs.ErrInvalidArgument, "reason: at most 200 printable characters")
		}
		reason += ": " + why
	}
	rec, err := m.st.GetSandbox(ctx, tenant, id)
	if err != nil {
		return err
	}
	unlock := m.lock(id)
	defer unlock()
	return m.destroy(ctx, rec, reason)
}

func (m *Manager) destroy(ctx context.Context, rec store.Sandbox, reason string) error {
	rec, err := m.st.GetSandbox(ctx, "", rec.ID) // fresh, under the lock
	if err != nil {
		return err
	}
	if State(rec.State) == Destroyed {
		return nil
	}
	if err := m.be.Destroy(context.WithoutCancel(ctx), rec.ID); err != nil {
		return fmt.Errorf("destroy %s: %w", rec.ID, err)
	}
	// The record stops naming the archive before the archive goes.
	var t Timers
	_ = json.Unmarshal(rec.Extra, &t)
	archive := t.Archive
	t.Archive = nil
	rec.Extra, _ = json.Marshal(t)
	if _, err = m.move(ctx, rec, Destroyed, reason); err != nil {
		return err
	}
	m.forget(ctx, rec.ID, archive)
	return nil
}

// forget drops what a destroyed sandbox leaves: its archive and its
// activity entries.
func (m *Manager) forget(ctx context.Context, id string, archive *Archive) {
	m.act.mu.Lock()
	delete(m.act.last, id)
	delete(m.act.holds, id)
	m.act.mu.Unlock()
	m.kickTemplates() // its layers may be unused now
	if archive != nil && m.opts.Blobs != nil {
		if err := m.opts.Blobs.Delete(context.WithoutCancel(ctx), archive.Key); err != nil {
			m.log.Warn("delete archive of destroyed sandbox", "id", id, "err", err)
		}
	}
}

// Live returns the id of a running sandbox of tenant, for operations that
// need its processes. A paused or suspended (or retired) one is resumed
// first, unless it was created without auto-resume; then, as for any other
// state, the answer is a conflict naming the state. Every call counts as
// activity for the idle timer.
func (m *Manager) Live(ctx context.Context, tenant, id string) (string, error) {
	rec, err := m.st.GetSandbox(ctx, tenant, id)
	if err != nil {
		return "", err
	}
	m.Touch(id)
	switch State(rec.State) {
	case Running:
		return id, nil
	case Paused, Suspended, Retired:
		sb, err := fromRecord(rec)
		if err != nil {
			return "", err
		}
		if sb.Spec.NoAutoResume {
			return "", &errdefs.TransitionError{ID: id, From: rec.State, To: string(Running)}
		}
		if _, err := m.Resume(ctx, tenant, id); err != nil {
			return "", err
		}
		return id, nil
	}
	return "", &errdefs.TransitionError{ID: id, From: rec.State, To: string(Running)}
}

// Died records that a running sandbox's init is gone.
func (m *Manager) Died(ctx context.Context, id, reason string) {
	unlock := m.lock(id)
	defer unlock()
	rec, err := m.st.GetSandbox(ctx, "", id)
	if err != nil || State(rec.State) != Running {
		return
	}
	if _, err := m.move(ctx, rec, Failed, reason); err != nil {
		m.log.Error("record failed sandbox", "id", id, "err", err)
	}
}

// CheckAlive asks the backend whether a sandbox's init still runs and
// records a failure if not. It returns the error to give the caller.
func (m *Manager) CheckAlive(ctx context.Context, id string, cause error) error {
	info, err := m.be.Inspect(ctx, id)
	if err == nil && info.Status == backend.StatusDead {
		m.Died(ctx, id, info.Reason)
		return &errdefs.TransitionError{ID: id, From: string(Failed), To: string(Running)}
	}
	return cause
}

func fromRecord(r store.Sandbox) (Sandbox, error) {
	sb := Sandbox{ID: r.ID, Tenant: r.Tenant, State: State(r.State), Reason: r.Reason, Created: r.Created, Updated: r.Updated}
	if err := json.Unmarshal(r.Spec, &sb.Spec); err != nil {
		return sb, fmt.Errorf("sandbox %s: stored spec: %w", r.ID, err)
	}
	sb.Spec.Labels, sb.Spec.Metadata = r.Labels, r.Metadata
	if len(r.Extra) > 0 {
		if err := json.Unmarshal(r.Extra, &sb.Timers); err != nil {
			return sb, fmt.Errorf("sandbox %s: stored lifecycle data: %w", r.ID, err)
		}
	}
	return sb, nil
}
