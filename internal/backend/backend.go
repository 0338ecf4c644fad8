// Package backend defines what a sandbox runtime must do for hutch: the small
// Backend interface every runtime implements, the optional capabilities a
// runtime may add (found by type assertion), and the value types that cross
// it. Backends do mechanics only; the manager above owns state.
//
// The shared conformance suite lives in backend/backendtest; every backend
// must pass it.
package backend

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net"
	"syscall"
	"time"
)

// Backend turns a Spec into an isolated machine and runs commands in it.
// Every method is context first. Destroy is idempotent.
type Backend interface {
	// Name is the backend's registry name, e.g. "native".
	Name() string
	// Capabilities says which optional features this backend offers.
	Capabilities() Capabilities
	// Create makes and starts a sandbox. On error nothing of it is left.
	Create(ctx context.Context, spec Spec) (Handle, error)
	// Stop ends every process of a sandbox but keeps its filesystem.
	Stop(ctx context.Context, id string) error
	// Start starts a stopped sandbox again over the filesystem it kept.
	Start(ctx context.Context, id string) (Handle, error)
	// Destroy releases everything of a sandbox. A missing one is no error.
	Destroy(ctx context.Context, id string) error
	// Inspect reports what the backend sees of a sandbox now.
	Inspect(ctx context.Context, id string) (Info, error)
	// Recover re-attaches to a sandbox after a daemon restart, from the
	// handle the caller persisted.
	Recover(ctx context.Context, h Handle) (Info, error)
	// Exec starts a command; the returned Process streams its output.
	Exec(ctx context.Context, id string, req ExecRequest) (Process, error)
}

// Capabilities are the optional features of a backend.
type Capabilities struct {
	Pause       bool `json:"pause"`
	Suspend     bool `json:"suspend"`
	Snapshot    bool `json:"snapshot"`
	PTY         bool `json:"pty"`
	NativeFiles bool `json:"native_files"`
	Attach      bool `json:"attach"`
}

// Spec describes a sandbox to create.
type Spec struct {
	ID string `json:"id"`
	// Base names the root filesystem: "host" (default), "dir:/path",
	// "oci:/path/image.tar" (docker save) or "oci:/path/layout-dir".
	Base string `json:"base,omitempty"`
	// Layers are extra read-only layer directories stacked on the base,
	// lowest first (templates).
	Layers   []string          `json:"layers,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	Hostname string            `json:"hostname,omitempty"`
	Limits   Limits            `json:"limits"`
}

// Limits are a sandbox's resource limits. Zero means the backend default.
type Limits struct {
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	Pids        int64 `json:"pids,omitempty"`
	// CPUMillis is CPU time per second of wall time: 1000 is one core.
	CPUMillis int64 `json:"cpu_millis,omitempty"`
}

// Handle is what a caller persists to find a sandbox again after a restart.
// State is opaque to the caller and versioned by the backend.
type Handle struct {
	ID      string          `json:"id"`
	Backend string          `json:"backend"`
	Version int             `json:"version"`
	State   json.RawMessage `json:"state"`
}

// Status is the backend's view of a sandbox.
type Status string

// The statuses a backend reports.
const (
	StatusRunning Status = "running"
	StatusStopped Status = "stopped"
	StatusPaused  Status = "paused"
	StatusDead    Status = "dead" // init died unexpectedly
)

// Info is what Inspect reports.
type Info struct {
	ID      string    `json:"id"`
	Status  Status    `json:"status"`
	Pid     int       `json:"pid,omitempty"` // init's pid on the host
	Created time.Time `json:"created"`
	Reason  string    `json:"reason,omitempty"`
	// Cgroup names the sandbox's cgroup, where the backend has one.
	Cgroup string `json:"cgroup,omitempty"`
	// Processes counts the sandbox's processes other than its init (-1:
	// unknown). The manager's idle detection reads it.
	Processes int `json:"processes"`
}

// ExecRequest is one command to run in a sandbox with `sh -c`.
type ExecRequest struct {
	Cmd string            `json:"cmd"`
	Env map[string]string `json:"env,omitempty"`
	Cwd string            `json:"cwd,omitempty"`
	// TTY runs the command on a pseudo-terminal of Rows x Cols.
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// Stdin keeps the command's stdin open for Process.Write; otherwise it
	// reads /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// Timeout kills the process group after this long (0: none).
	Timeout time.Duration `json:"timeout,omitempty"`
	// Background keeps the process running when the caller detaches.
	Background bool   `json:"background,omitempty"`
	Tag        string `json:"tag,omitempty"`
}

// Stream names an output stream.
type Stream uint8

// Output streams. A TTY process writes everything to Stdout.
const (
	Stdout Stream = 1
	Stderr Stream = 2
)

// Event is one item of a process's output: a chunk of a stream or, last,
// its exit.
type Event struct {
	Seq    uint64      `json:"seq"`
	Stream Stream      `json:"stream,omitempty"`
	Data   []byte      `json:"data,omitempty"`
	Exit   *ExitStatus `json:"exit,omitempty"`
}

// ExitStatus is how a process ended. Code is -1 when it was killed by a
// signal, in which case Signal names it; TimedOut and Killed say why.
type ExitStatus struct {
	Code     int    `json:"code"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Killed   bool   `json:"killed,omitempty"` // killed by an abort or Kill
	// Lost is the number of output bytes dropped from the retained log.
	Lost uint64 `json:"lost,omitempty"`
}

// Process is a running (or finished) command. Recv returns events in
// order and io.EOF after the exit event. Close detaches: a foreground
// process is killed, a background one keeps running.
type Process interface {
	ID() string
	Pid() int
	Write(p []byte) (int, error)
	CloseStdin() error
	Signal(ctx context.Context, sig syscall.Signal) error
	Resize(ctx context.Context, rows, cols uint16) error
	Recv() (Event, error)
	Close() error
}

// ProcessInfo describes a process in a sandbox's process table.
type ProcessInfo struct {
	ID      string      `json:"id"`
	Pid     int         `json:"pid"`
	Cmd     string      `json:"cmd"`
	Tag     string      `json:"tag,omitempty"`
	TTY     bool        `json:"tty,omitempty"`
	Started time.Time   `json:"started"`
	Exit    *ExitStatus `json:"exit,omitempty"`
	// NextSeq is the sequence number the next output chunk will carry.
	NextSeq uint64 `json:"next_seq"`
}

// ProcessController is an optional capability: the process table of a
// sandbox. Attach re-attaches to a process's output from any retained
// sequence number (and, like Exec's Process, takes stdin, signals and
// resizes); closing it never kills the process.
type ProcessController interface {
	Attach(ctx context.Context, id, procID string, fromSeq uint64) (Process, error)
	Processes(ctx context.Context, id string) ([]ProcessInfo, error)
	ProcessInfo(ctx context.Context, id, procID string) (ProcessInfo, error)
	WriteStdin(ctx context.Context, id, procID string, r io.Reader, close bool) error
	SignalProcess(ctx context.Context, id, procID string, sig syscall.Signal) error
}

// Archiver is an optional capability: a directory as a tar stream, both
// ways, handled inside the sandbox.
type Archiver interface {
	ReadArchive(ctx context.Context, id, path string) (io.ReadCloser, error)
	WriteArchive(ctx context.Context, id, path string, r io.Reader) error
}

// FileInfo describes one file in a sandbox.
type FileInfo struct {
	Name    string      `json:"name"`
	Path    string      `json:"path"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"`
	ModTime time.Time   `json:"mtime"`
	IsDir   bool        `json:"is_dir"`
	Link    string      `json:"link,omitempty"` // symlink target
	UID     int         `json:"uid"`
	GID     int         `json:"gid"`
}

// ListOptions bound a directory listing.
type ListOptions struct {
	Depth int    `json:"depth,omitempty"` // 0 or 1: only the directory itself
	Glob  string `json:"glob,omitempty"`
}

// FileAccessor is an optional capability: file operations that run inside
// the sandbox, so a path or symlink can never lead out of it. Relative
// paths are relative to /workspace.
type FileAccessor interface {
	ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error)
	WriteFile(ctx context.Context, id, path string, mode fs.FileMode, r io.Reader) error
	Stat(ctx context.Context, id, path string) (FileInfo, error)
	List(ctx context.Context, id, path string, opts ListOptions) ([]FileInfo, error)
	Mkdir(ctx context.Context, id, path string, mode fs.FileMode) error
	Remove(ctx context.Context, id, path string, recursive bool) error
	Rename(ctx context.Context, id, from, to string) error
}

// Resizer is an optional capability: a process's terminal resized, the
// new size in effect when ResizeProcess returns (a Process's Resize only
// queues it on its stream, so input sent another way may overtake it).
type Resizer interface {
	ResizeProcess(ctx context.Context, id, procID string, rows, cols uint16) error
}

// ResizeProcess resizes a process's terminal: through the backend's
// Resizer, in effect on return, or else queued on an attached stream (pc).
func ResizeProcess(ctx context.Context, be Backend, pc ProcessController, id, procID string, rows, cols uint16) error {
	if rz, ok := be.(Resizer); ok {
		return rz.ResizeProcess(ctx, id, procID, rows, cols)
	}
	pi, err := pc.ProcessInfo(ctx, id, procID)
	if err != nil {
		return err
	}
	p, err := pc.Attach(ctx, id, procID, pi.NextSeq)
	if err != nil {
		return err
	}
	defer p.Close()
	return p.Resize(ctx, rows, cols)
}

// PortDialer is an optional capability: a TCP connection to a port of a
// sandbox, made from inside its network namespace (to its loopback), so
// exposing a port needs no route into the sandbox and works under any
// network policy.
type PortDialer interface {
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
}

// ArchiveStats describe a packed writable layer.
type ArchiveStats struct {
	Files      int    `json:"files"`
	Bytes      int64  `json:"bytes"`      // uncompressed
	Compressed int64  `json:"compressed"` // what was written
	SHA256     string `json:"sha256"`     // of what was written
}

// Suspender is an optional capability: keep a sandbox's whole writable
// layer (everything it changed in its root filesystem, not only
// /workspace) while its processes and memory are let go.
type Suspender interface {
	// Suspend freezes the sandbox and hands its writable layer (tar +
	// zstd) to store as a stream. Only when store returns nil — the
	// archive is safely kept — is the sandbox stopped and the layer's disk
	// released. If store fails, the sandbox is thawed and runs on exactly
	// as before, and store's error is returned.
	Suspend(ctx context.Context, id string, store func(io.Reader) error) (ArchiveStats, error)
	// Resume restores the writable layer from r, over the same base, and
	// starts a new init.
	Resume(ctx context.Context, id string, r io.Reader) (Handle, error)
}

// Snapshotter is an optional capability: freeze a sandbox's filesystem as
// it is now into a read-only layer directory that new sandboxes can stack
// (Spec.Layers) — the basis of templates and fork.
type Snapshotter interface {
	// Snapshot writes the sandbox's writable layer, as a lower layer, to
	// dst (which must not exist). Its processes are frozen meanwhile and
	// run on after. Layers of the sandbox itself are not included: a new
	// sandbox stacks dst over the same base and layers.
	Snapshot(ctx context.Context, id, dst string) (ArchiveStats, error)
}

// Pauser is an optional capability: freeze and thaw every process.
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Unpause(ctx context.Context, id string) error
}

// Wait reads p to its end, collecting output, and returns it with the exit.
func Wait(p Process, stdout, stderr io.Writer) (ExitStatus, error) {
	for {
		ev, err := p.Recv()
		if err != nil {
			return ExitStatus{}, err
		}
		if ev.Exit != nil {
			return *ev.Exit, nil
		}
		w := stdout
		if ev.Stream == Stderr {
			w = stderr
		}
		if w != nil {
			if _, err := w.Write(ev.Data); err != nil {
				return ExitStatus{}, err
			}
		}
	}
}

// WatchOp is the kind of a change a Watcher reports.
type WatchOp string

// The changes a Watcher reports.
const (
	WatchCreate WatchOp = "create"
	WatchWrite  WatchOp = "write"
	WatchRemove WatchOp = "remove"
	WatchRename WatchOp = "rename" // the old name of a move
	WatchChmod  WatchOp = "chmod"
)

// WatchEvent is one change under a watched directory.
type WatchEvent struct {
	Path string  `json:"path"` // absolute, inside the sandbox
	Op   WatchOp `json:"op"`
}

// WatchStream delivers a watch's events until Close; Next returns an error
// once the watch ends (the directory went away, the sandbox stopped).
type WatchStream interface {
	Next() (WatchEvent, error)
	Close() error
}

// Watcher is an optional capability: changes under a directory of a
// sandbox as they happen, observed from inside it.
type Watcher interface {
	Watch(ctx context.Context, id, path string, recursive bool) (WatchStream, error)
}
