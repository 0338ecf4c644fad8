// Package provider is one Go API over several sandbox services: the Go
// counterpart of Rivet's sandbox adapter. A Provider creates, connects to,
// suspends and destroys sandboxes; a Sandbox runs commands and reads and
// writes files. hutchp implements it over hutch's own API and e2bp over
// E2B's (REST control API + envd), so the same code drives E2B's cloud or a
// self-hosted hutch through either door.
//
// Errors carry hutch's identities whatever the provider:
// errors.Is(err, provider.ErrNotFound) is how Connect says a sandbox is gone.
package provider

import (
	"context"
	"io/fs"
	"time"

	hutch "github.com/hutch-dev/hutch/sdk"
)

// The error identities every provider's errors match (hutch's own).
var (
	ErrNotFound         = hutch.ErrNotFound
	ErrInvalidArgument  = hutch.ErrInvalidArgument
	ErrConflict         = hutch.ErrConflict
	ErrUnauthenticated  = hutch.ErrUnauthenticated
	ErrNotImplemented   = hutch.ErrNotImplemented
	ErrUnavailable      = hutch.ErrUnavailable
	ErrDeadlineExceeded = hutch.ErrDeadlineExceeded
)

// Provider makes and finds sandboxes.
type Provider interface {
	// Name names the provider, e.g. "hutch" or "e2b".
	Name() string
	// Create makes a sandbox and returns it running.
	Create(ctx context.Context, o CreateOptions) (Sandbox, error)
	// Connect returns a running handle on an existing sandbox, resuming a
	// paused or suspended one. A sandbox that no longer exists is an error
	// matching ErrNotFound; every other failure is some other error.
	Connect(ctx context.Context, id string) (Sandbox, error)
	// Suspend stops a sandbox's work but keeps its files for Connect.
	Suspend(ctx context.Context, id string) error
	// Destroy ends a sandbox. Destroying one that is gone succeeds.
	Destroy(ctx context.Context, id string) error
}

// CreateOptions describe a sandbox to create. Zero values are the
// provider's defaults.
type CreateOptions struct {
	Template string // the provider's template name; "" = its default
	Env      map[string]string
	Metadata map[string]string
	Timeout  time.Duration // how long it may live; 0 = the provider's default
}

// Sandbox is one sandbox. Relative paths are relative to the provider's
// working directory (hutch: /workspace).
type Sandbox interface {
	ID() string
	// Exec runs cmd with a shell and waits for it. A non-zero exit is a
	// result, not an error; so is a timeout (ExitCode nil, TimedOut).
	Exec(ctx context.Context, cmd string, o ExecOptions) (ExecResult, error)
	ReadFile(ctx context.Context, path string) ([]byte, error)
	// WriteFile creates or replaces a file, making its parent directories.
	WriteFile(ctx context.Context, path string, data []byte) error
	// Mkdir makes a directory and its parents; an existing one is fine.
	Mkdir(ctx context.Context, path string) error
	Stat(ctx context.Context, path string) (FileInfo, error)
	// ReadDir lists a directory's entries.
	ReadDir(ctx context.Context, path string) ([]FileInfo, error)
	Exists(ctx context.Context, path string) (bool, error)
	// Remove removes a file or a whole directory; a missing path is fine.
	Remove(ctx context.Context, path string) error
}

// Stream names an output stream of a command.
type Stream int

// Output streams.
const (
	Stdout Stream = 1
	Stderr Stream = 2
)

// ExecOptions tune one command.
type ExecOptions struct {
	Cwd     string
	Env     map[string]string
	Timeout time.Duration // 0: the provider's default
	Stdin   []byte        // given to the command, then closed
	// OnData, when set, sees output as it comes (it is also collected).
	OnData func(s Stream, data []byte)
}

// ExecResult is how a command ended and what it wrote.
type ExecResult struct {
	ExitCode *int // nil when it did not exit by itself (timeout, signal)
	TimedOut bool
	Stdout   []byte
	Stderr   []byte
}

// FileInfo describes a file.
type FileInfo struct {
	Name    string
	Path    string // absolute, as the sandbox sees it
	Size    int64
	IsDir   bool
	Mode    fs.FileMode // permission bits
	ModTime time.Time
}
