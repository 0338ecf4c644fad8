package native_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/backend/backendtest"
	"github.com/hutch-dev/hutch/internal/backend/native"
)

// TestRecoverThawsAnInterruptedFreeze: a daemon that dies while a suspend
// has the sandbox frozen (its archive half written) must not leave it
// frozen for good. A second backend on the same data directory stands for
// the restarted daemon: recovering the sandbox thaws it, while a paused
// sandbox (frozen on purpose) stays frozen. The end-to-end version, with a
// real kill -9, is internal/crashtest.
func TestRecoverThawsAnInterruptedFreeze(t *testing.T) {
	requireRoot(t)
	dir := traversableTempDir(t)
	first := newBackendOpts(t, native.Options{DataDir: dir, WarmInits: -1})
	ctx := context.Background()
	id, paused := backendtest.NewID("frz"), backendtest.NewID("pau")
	h := backendtest.Create(t, first, backend.Spec{ID: id})
	hp := backendtest.Create(t, first, backend.Spec{ID: paused})
	backendtest.Sh(t, first, id, "echo kept > /workspace/f")
	if err := first.Pause(ctx, paused); err != nil {
		t.Fatal(err)
	}

	storing, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := first.Suspend(ctx, id, func(r io.Reader) error {
			close(storing)
			<-release // the daemon "dies" here, mid-store
			return errors.New("the daemon died")
		})
		done <- err
	}()
	<-storing

	second := newBackendOpts(t, native.Options{DataDir: dir, WarmInits: -1})
	for _, hh := range []backend.Handle{h, hp} {
		if _, err := second.Recover(ctx, hh); err != nil {
			t.Fatal(err)
		}
	}
	out := make(chan string, 1)
	go func() {
		r, err := backendtest.ExecErr(second, id, backend.ExecRequest{Cmd: "cat /workspace/f"})
		if err != nil {
			out <- err.Error()
			return
		}
		out <- r.Stdout
	}()
	select {
	case got := <-out:
		if got != "kept\n" {
			t.Fatalf("after recovery: %q", got)
		}
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("the sandbox a dead suspend froze is still frozen after recovery")
	}
	// The paused one stays frozen: a command in it does not finish until
	// it is unpaused.
	ran := make(chan error, 1)
	go func() {
		_, err := backendtest.ExecErr(second, paused, backend.ExecRequest{Cmd: "true"})
		ran <- err
	}()
	select {
	case err := <-ran:
		t.Fatalf("a command ran in a paused sandbox after recovery (%v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	close(release)
	if err := <-done; err == nil {
		t.Fatal("the interrupted suspend succeeded")
	}
	if err := second.Unpause(ctx, paused); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatalf("the command in the unpaused sandbox: %v", err)
	}
}
