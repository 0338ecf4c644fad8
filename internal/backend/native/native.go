// Package native is hutch's own Linux sandbox runtime: no VM, no Docker and
// no external runtime binary. Each sandbox is a user namespace mapped to its
// own unprivileged host uid range plus mount, pid, net, ipc and uts
// namespaces; its root is an overlayfs (read-only idmapped lower layers, a
// per-sandbox upper) it pivots into; cgroups bound its memory, pids and CPU;
// seccomp, no_new_privs, a minimal capability set and Landlock confine it.
// PID 1 is the hutch binary itself, re-executed as init + agent (see
// InitMain and package agent).
//
// The host side never mounts anything in the host's mount namespace: layers
// are prepared as detached idmapped mount trees and handed to init over a
// socket, so a sandbox leaves no mount behind on the host.
package native

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"

	"github.com/hutch-dev/hutch/internal/agent"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/cgroups"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/imagefs"
)

// Name is the backend's registry name.
const Name = "native"

// stateVersion versions the Handle state this package writes.
const stateVersion = 1

// Options configure the native backend.
type Options struct {
	// DataDir holds sandboxes, bases and images. Every ancestor must be
	// traversable (o+x): a sandbox's root is an unprivileged host uid.
	DataDir string
	// InitPath is the hutch binary re-executed as init; default /proc/self/exe.
	InitPath string
	// UIDBase is the first host uid handed to sandboxes; each gets UIDSize
	// ids. Slots is how many ranges exist.
	UIDBase uint32
	UIDSize uint32
	Slots   int
	// CgroupParent is the cgroup under which sandboxes' groups are made;
	// empty nests them under the daemon's own cgroup.
	CgroupParent string
	// DefaultLimits apply where a Spec leaves a limit at zero.
	DefaultLimits backend.Limits
	// TmpSize is the size of each sandbox's /tmp tmpfs in bytes.
	TmpSize int64
	// NoLandlock turns Landlock off (it is on where the kernel has it).
	NoLandlock bool
	// WarmInits is how many inits wait parked, ready to become sandboxes
	// (default 2; negative: none).
	WarmInits int
	// Nameserver is the resolver sandboxes are given (the network
	// gateway's); empty: /etc/resolv.conf stays as the base has it.
	Nameserver string
	// CA is the PEM certificate of the daemon's egress CA, which every
	// sandbox trusts (credential injection terminates TLS with it).
	CA []byte
}

func (o *Options) defaults() {
	if o.InitPath == "" {
		o.InitPath = "/proc/self/exe"
	}
	if o.UIDBase == 0 {
		o.UIDBase = 1 << 30
	}
	if o.UIDSize == 0 {
		o.UIDSize = 65536
	}
	if o.Slots == 0 {
		o.Slots = 4096
	}
	if o.DefaultLimits.MemoryBytes == 0 {
		o.DefaultLimits.MemoryBytes = 2 << 30
	}
	if o.DefaultLimits.Pids == 0 {
		o.DefaultLimits.Pids = 1024
	}
	if o.TmpSize == 0 {
		o.TmpSize = 512 << 20
	}
	if o.WarmInits == 0 {
		o.WarmInits = 2
	}
}

// Backend is the native runtime.
type Backend struct {
	opts   Options
	cg     *cgroups.Manager
	images *imagefs.Cache
	slots  *slotSet

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	ids       map[string]*sync.Mutex // per-id lifecycle locks

	tag  string       // names this data dir's cgroups
	pool chan *parked // warm inits; nil when disabled
	stop func()       // stops the pool's refiller
	done chan struct{}

	hostOnce sync.Once
	host     rootfs
	hostErr  error
}

var (
	_ backend.Backend           = (*Backend)(nil)
	_ backend.ProcessController = (*Backend)(nil)
	_ backend.Archiver          = (*Backend)(nil)
	_ backend.Pauser            = (*Backend)(nil)
	_ backend.Suspender         = (*Backend)(nil)
	_ backend.Snapshotter       = (*Backend)(nil)
	_ backend.FileAccessor      = (*Backend)(nil)
	_ backend.Resizer           = (*Backend)(nil)
)

// New makes the backend, checking that this host can run it.
func New(opts Options) (*Backend, error) {
	opts.defaults()
	if opts.DataDir == "" {
		return nil, fmt.Errorf("native: no data dir: %w", errdefs.ErrInvalidArgument)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("native: needs root (to map uid ranges and make idmapped mounts): %w", errdefs.ErrFailedPrecondition)
	}
	dir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, err
	}
	opts.DataDir = dir
	for _, d := range []string{"sandboxes", "bases", "images", "pool"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o711); err != nil {
			return nil, fmt.Errorf("native: %w", err)
		}
		if err := os.Chmod(filepath.Join(dir, d), 0o711); err != nil {
			return nil, err
		}
	}
	if err := checkTraversable(dir); err != nil {
		return nil, err
	}
	cg, err := cgroups.New(cgroups.Options{Parent: opts.CgroupParent})
	if err != nil {
		return nil, fmt.Errorf("native: cgroups: %w", err)
	}
	images, err := imagefs.NewCache(filepath.Join(dir, "images"))
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(dir))
	b := &Backend{opts: opts, cg: cg, images: images, slots: newSlotSet(opts.Slots),
		sandboxes: map[string]*sandbox{}, ids: map[string]*sync.Mutex{}, tag: "h" + hex.EncodeToString(sum[:4])}
	b.claimSlotsOnDisk()
	b.sweepCgroups()
	b.startPool()
	return b, nil
}

// checkTraversable makes sure an unprivileged uid can walk down to dir.
func checkTraversable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("native: %s is not traversable by other users (needs o+x): sandboxes run as unprivileged host uids and must reach their layers under %s: %w",
				d, dir, errdefs.ErrFailedPrecondition)
		}
		if d == "/" {
			return nil
		}
	}
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return Name }

// Capabilities implements backend.Backend.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Pause: true, Suspend: true, Snapshot: true, PTY: true, NativeFiles: true, Attach: true}
}

// Close stops the warm pool and kills its parked inits. Sandboxes keep
// running: a daemon restart must not touch them.
func (b *Backend) Close() error {
	b.stopPool()
	return nil
}

var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

func (b *Backend) lockID(id string) func() {
	b.mu.Lock()
	l := b.ids[id]
	if l == nil {
		l = &sync.Mutex{}
		b.ids[id] = l
	}
	b.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func (b *Backend) get(id string) (*sandbox, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sandboxes[id]
	if s == nil {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return s, nil
}

func (b *Backend) running(id string) (*sandbox, error) {
	s, err := b.get(id)
	if err != nil {
		return nil, err
	}
	if !s.alive() {
		return nil, fmt.Errorf("sandbox %q is not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	return s, nil
}

// Create implements backend.Backend.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) (backend.Handle, error) {
	if !idPattern.MatchString(spec.ID) {
		return backend.Handle{}, fmt.Errorf("sandbox id %q: want [a-z0-9][a-z0-9-]{0,62}: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if err := validateLimits(spec.Limits); err != nil {
		return backend.Handle{}, err
	}
	unlock := b.lockID(spec.ID)
	defer unlock()
	if _, err := b.get(spec.ID); err == nil {
		return backend.Handle{}, fmt.Errorf("sandbox %q: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	if _, err := os.Lstat(b.dir(spec.ID)); err == nil {
		return backend.Handle{}, fmt.Errorf("sandbox %q has a directory on disk: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	s, err := b.create(ctx, spec)
	if err != nil {
		return backend.Handle{}, err
	}
	return s.handle(), nil
}

func validateLimits(l backend.Limits) error {
	switch {
	case l.MemoryBytes < 0 || (l.MemoryBytes > 0 && l.MemoryBytes < 16<<20):
		return fmt.Errorf("memory limit %d: want at least 16 MiB: %w", l.MemoryBytes, errdefs.ErrInvalidArgument)
	case l.Pids < 0 || (l.Pids > 0 && l.Pids < 8):
		return fmt.Errorf("pids limit %d: want at least 8: %w", l.Pids, errdefs.ErrInvalidArgument)
	case l.CPUMillis < 0 || (l.CPUMillis > 0 && l.CPUMillis < 10):
		return fmt.Errorf("cpu limit %d millicores: want at least 10: %w", l.CPUMillis, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (b *Backend) dir(id string) string { return filepath.Join(b.opts.DataDir, "sandboxes", id) }

// Stop implements backend.Backend: init and everything in the sandbox die,
// the filesystem stays.
func (b *Backend) Stop(ctx context.Context, id string) error {
	unlock := b.lockID(id)
	defer unlock()
	s, err := b.get(id)
	if err != nil {
		return err
	}
	return s.stop(ctx)
}

// Start implements backend.Backend.
func (b *Backend) Start(ctx context.Context, id string) (backend.Handle, error) {
	unlock := b.lockID(id)
	defer unlock()
	s, err := b.get(id)
	if err != nil {
		return backend.Handle{}, err
	}
	if s.alive() {
		return backend.Handle{}, &errdefs.TransitionError{ID: id, From: "running", To: "running"}
	}
	if err := b.start(ctx, s, nil); err != nil {
		return backend.Handle{}, err
	}
	return s.handle(), nil
}

// Destroy implements backend.Backend. It works on a sandbox whose init
// died, on one only on disk, and on one already gone.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return nil
	}
	unlock := b.lockID(id)
	defer unlock()
	ctx = context.WithoutCancel(ctx)
	s, err := b.get(id)
	if err != nil {
		s = b.loadFromDisk(id)
		if s == nil {
			return nil
		}
	}
	if err := s.stop(ctx); err != nil {
		return err
	}
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	b.mu.Lock()
	delete(b.sandboxes, id)
	b.mu.Unlock()
	b.slots.release(s.state.Slot)
	return nil
}

// Inspect implements backend.Backend.
func (b *Backend) Inspect(ctx context.Context, id string) (backend.Info, error) {
	s, err := b.get(id)
	if err != nil {
		return backend.Info{}, err
	}
	return s.info(), nil
}

// Recover implements backend.Backend.
func (b *Backend) Recover(ctx context.Context, h backend.Handle) (backend.Info, error) {
	if h.Backend != "" && h.Backend != Name {
		return backend.Info{}, fmt.Errorf("handle of backend %q: %w", h.Backend, errdefs.ErrInvalidArgument)
	}
	if h.Version != stateVersion {
		return backend.Info{}, fmt.Errorf("handle version %d, want %d: %w", h.Version, stateVersion, errdefs.ErrInvalidArgument)
	}
	var st state
	if err := json.Unmarshal(h.State, &st); err != nil || st.ID != h.ID || !idPattern.MatchString(h.ID) {
		return backend.Info{}, fmt.Errorf("handle state of %q is malformed: %w", h.ID, errdefs.ErrInvalidArgument)
	}
	unlock := b.lockID(h.ID)
	defer unlock()
	if s, err := b.get(h.ID); err == nil {
		return s.info(), nil
	}
	if _, err := os.Stat(b.dir(h.ID)); err != nil {
		return backend.Info{}, fmt.Errorf("sandbox %q has no directory: %w", h.ID, errdefs.ErrNotFound)
	}
	s := b.adopt(st)
	return s.info(), nil
}

// Exec implements backend.Backend.
func (b *Backend) Exec(ctx context.Context, id string, req backend.ExecRequest) (backend.Process, error) {
	s, err := b.running(id)
	if err != nil {
		return nil, err
	}
	s.touch()
	return s.client.Exec(ctx, req)
}

// Attach implements backend.ProcessController.
func (b *Backend) Attach(ctx context.Context, id, procID string, fromSeq uint64) (backend.Process, error) {
	s, err := b.running(id)
	if err != nil {
		return nil, err
	}
	return s.client.Attach(ctx, procID, fromSeq)
}

// Processes implements backend.ProcessController.
func (b *Backend) Processes(ctx context.Context, id string) ([]backend.ProcessInfo, error) {
	s, err := b.running(id)
	if err != nil {
		return nil, err
	}
	return s.client.Processes(ctx)
}

// ProcessInfo implements backend.ProcessController.
func (b *Backend) ProcessInfo(ctx context.Context, id, procID string) (backend.ProcessInfo, error) {
	c, err := b.files(id)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	return c.Process(ctx, procID)
}

// WriteStdin implements backend.ProcessController.
func (b *Backend) WriteStdin(ctx context.Context, id, procID string, r io.Reader, close bool) error {
	c, err := b.files(id)
	if err != nil {
		return err
	}
	return c.WriteStdin(ctx, procID, r, close)
}

// SignalProcess implements backend.ProcessController.
func (b *Backend) SignalProcess(ctx context.Context, id, procID string, sig syscall.Signal) error {
	c, err := b.files(id)
	if err != nil {
		return err
	}
	return c.Signal(ctx, procID, sig)
}

// ResizeProcess implements backend.Resizer.
func (b *Backend) ResizeProcess(ctx context.Context, id, procID string, rows, cols uint16) error {
	c, err := b.files(id)
	if err != nil {
		return err
	}
	return c.Resize(ctx, procID, rows, cols)
}

// ReadArchive implements backend.Archiver.
func (b *Backend) ReadArchive(ctx context.Context, id, p string) (io.ReadCloser, error) {
	c, err := b.files(id)
	if err != nil {
		return nil, err
	}
	return c.ReadArchive(ctx, p)
}

// WriteArchive implements backend.Archiver.
func (b *Backend) WriteArchive(ctx context.Context, id, p string, r io.Reader) error {
	c, err := b.files(id)
	if err != nil {
		return err
	}
	return c.WriteArchive(ctx, p, r)
}

// files returns the agent client of a running sandbox.
func (b *Backend) files(id string) (*agent.Client, error) {
	s, err := b.running(id)
	if err != nil {
		return nil, err
	}
	return s.client, nil
}

// ReadFile implements backend.FileAccessor.
func (b *Backend) ReadFile(ctx context.Context, id, p string) (io.ReadCloser, error) {
	c, err := b.files(id)
	if err != nil {
		return nil, err
	}
	return c.ReadFile(ctx, p)
}

// WriteFile implements backend.FileAccessor.
func (b *Backend) WriteFile(ctx context.Context, id, p string, mode fs.FileMode, r io.Reader) error {
	c, err := b.files(id)
	if err != nil {
		return err
	}
	return c.WriteFile(ctx, p, mode, r)
}

// Stat implements backend.FileAccessor.
func (b *Backend) Stat(ctx context.Context, id, p string) (backend.FileInfo, error) {
	c, err := b.files(id)
	if err != nil {
		return backend.FileInfo{}, err
	}
	return c.Stat(ctx, p)
}

// List implements backend.FileAccessor.
func (b *Backend) List(ctx context.Context, id, p string, opts backend.ListOptions) ([]backend.FileInfo, error) {
	c, err := b.files(id)
	if err != nil {
		return nil, err
	}
	return c.List(ctx, p, opts)
}

// Mkdir implements backend.FileAccessor.
func (b *Backend) Mkdir(ctx context.Context, id, p string, mode fs.FileMode) error {
	c, err := b.files(id)
	if err != nil {
		return err
	}
	return c.Mkdir(ctx, p, mode)
}

// Remove implements backend.FileAccessor.
func (b *Backend) Remove(ctx context.Context, id, p string, recursive bool) error {
	c, err := b.files(id)
	if err != nil {
		return err
	}
	return c.Remove(ctx, p, recursive)
}

// Rename implements backend.FileAccessor.
func (b *Backend) Rename(ctx context.Context, id, from, to string) error {
	c, err := b.files(id)
	if err != nil {
		return err
	}
	return c.Rename(ctx, from, to)
}

// Pause implements backend.Pauser: every process of the sandbox freezes.
func (b *Backend) Pause(ctx context.Context, id string) error {
	s, err := b.running(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.group.Freeze(); err != nil {
		return err
	}
	s.paused = true
	return nil
}

// Unpause implements backend.Pauser.
func (b *Backend) Unpause(ctx context.Context, id string) error {
	s, err := b.running(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.group.Thaw(); err != nil {
		return err
	}
	s.paused = false
	return nil
}
