// Package backendtest is the conformance suite every hutch backend must
// pass: isolation facts, exec semantics (stdin, env, cwd, timeouts,
// signals, large and binary output, PTY, re-attach), file operations
// (including symlink escapes), limits, lifecycle and cleanup. A backend's
// test calls Run with a Harness; the suite uses only the backend's public
// interfaces and checks optional capabilities where the backend has them.
package backendtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/backend"
)

// Harness tells the suite how to make and inspect backends.
type Harness struct {
	// New returns a backend over a fresh data directory.
	New func(t *testing.T) backend.Backend
	// Reopen returns a second backend instance over b's data directory, as
	// a daemon restart would.
	Reopen func(t *testing.T, b backend.Backend) backend.Backend
	// Leaks lists what a destroyed sandbox left behind on the host
	// (mounts, cgroups, namespaces, processes); nil means nothing.
	Leaks func(t *testing.T, b backend.Backend, id string, info backend.Info) []string
	// KillInit kills a sandbox's init from outside, as a crash would.
	KillInit func(t *testing.T, b backend.Backend, info backend.Info)
	// HostMarker is a host path that must not be visible in any sandbox.
	HostMarker string
	// LayerDir returns a directory on which snapshots may be written as
	// layers the backend can mount (nil: no snapshot tests).
	LayerDir func(t *testing.T) string
	// ExtraBases are more bases every sandbox test can run on (a directory
	// rootfs, an OCI image), besides the default.
	ExtraBases []string
}

var seq atomic.Int64

// NewID returns a sandbox id unique within this test binary.
func NewID(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%100000, seq.Add(1))
}

// Run runs the whole suite.
func Run(t *testing.T, h Harness) {
	b := h.New(t)
	t.Run("Isolation", func(t *testing.T) { testIsolation(t, h, b) })
	t.Run("Exec", func(t *testing.T) { testExec(t, b) })
	t.Run("ExecTTY", func(t *testing.T) { testTTY(t, b) })
	t.Run("Processes", func(t *testing.T) { testProcesses(t, b) })
	t.Run("Files", func(t *testing.T) { testFiles(t, h, b) })
	t.Run("Limits", func(t *testing.T) { testLimits(t, b) })
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, h, b) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, h, b) })
	for _, base := range h.ExtraBases {
		t.Run("Base="+base, func(t *testing.T) { testBase(t, b, base) })
	}
}

// Create makes a sandbox and destroys it when the test ends.
func Create(t *testing.T, b backend.Backend, spec backend.Spec) backend.Handle {
	t.Helper()
	if spec.ID == "" {
		spec.ID = NewID("t")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create %s: %v", spec.ID, err)
	}
	t.Cleanup(func() {
		if err := b.Destroy(context.Background(), spec.ID); err != nil {
			t.Errorf("destroy %s: %v", spec.ID, err)
		}
	})
	return h
}

// Result is a finished command's output.
type Result struct {
	Stdout, Stderr string
	Exit           backend.ExitStatus
}

// Exec runs a command to its end.
func Exec(t *testing.T, b backend.Backend, id string, req backend.ExecRequest) Result {
	t.Helper()
	r, err := ExecErr(b, id, req)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Cmd, err)
	}
	return r
}

// ExecErr runs a command to its end, returning errors.
func ExecErr(b backend.Backend, id string, req backend.ExecRequest) (Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := b.Exec(ctx, id, req)
	if err != nil {
		return Result{}, err
	}
	defer p.Close()
	var out, errb bytes.Buffer
	st, err := backend.Wait(p, &out, &errb)
	return Result{Stdout: out.String(), Stderr: errb.String(), Exit: st}, err
}

// Sh runs cmd and fails the test unless it exits 0; it returns stdout.
func Sh(t *testing.T, b backend.Backend, id, cmd string) string {
	t.Helper()
	r := Exec(t, b, id, backend.ExecRequest{Cmd: cmd})
	if r.Exit.Code != 0 {
		t.Fatalf("%q: exit %+v, stdout %q, stderr %q", cmd, r.Exit, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// WantErr fails unless err is of class want.
func WantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got error %v, want one of class %v", what, err, want)
	}
}

func readAll(t *testing.T) func(io.ReadCloser, error) string {
	return func(rc io.ReadCloser, err error) string { return readAllOf(t, rc, err) }
}

func readAllOf(t *testing.T, rc io.ReadCloser, err error) string {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func lines(s string) []string { return strings.Fields(strings.TrimSpace(s)) }
