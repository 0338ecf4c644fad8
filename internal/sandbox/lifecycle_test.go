package sandbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/blob"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/sandbox"
	"github.com/hutch-dev/hutch/internal/store"
)

func TestMain(m *testing.M) {
	if native.IsInit() {
		native.InitMain()
	}
	os.Exit(m.Run())
}

// env is a manager over a real store, backend and blob store in dir.
type env struct {
	dir string
	st  *store.Store
	be  *native.Backend
	m   *sandbox.Manager
}

func open(t *testing.T, dir string) *env {
	t.Helper()
	return openWith(t, dir, nil)
}

// openWith is open with the manager's options adjusted by opt.
func openWith(t *testing.T, dir string, opt func(*sandbox.Options)) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the manager's tests need root (native backend)")
	}
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(dir, "hutch.db"))
	if err != nil {
		t.Fatal(err)
	}
	be, err := native.New(native.Options{DataDir: dir, WarmInits: -1})
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := blob.NewDir(filepath.Join(dir, "archives"))
	if err != nil {
		t.Fatal(err)
	}
	opts := sandbox.Options{Blobs: blobs, ReapInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if opt != nil {
		opt(&opts)
	}
	m, err := sandbox.New(ctx, st, be, opts)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{dir: dir, st: st, be: be, m: m}
	t.Cleanup(e.close)
	return e
}

func (e *env) close() {
	if e.m == nil {
		return
	}
	e.m.Close()
	e.be.Close()
	e.st.Close()
	e.m = nil
}

func newDir(t *testing.T) string {
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func (e *env) create(t *testing.T, spec sandbox.Spec) sandbox.Sandbox {
	t.Helper()
	sb, err := e.m.Create(context.Background(), "", spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.m.Delete(context.Background(), "", sb.ID) })
	return sb
}

func (e *env) sh(t *testing.T, id, cmd string) string {
	t.Helper()
	ctx := context.Background()
	live, err := e.m.Live(ctx, "", id)
	if err != nil {
		t.Fatalf("live %s: %v", id, err)
	}
	p, err := e.be.Exec(ctx, live, backend.ExecRequest{Cmd: cmd})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var out strings.Builder
	st, err := backend.Wait(p, &out, nil)
	if err != nil || st.Code != 0 {
		t.Fatalf("%q: %+v %v %q", cmd, st, err, out.String())
	}
	return out.String()
}

func (e *env) state(t *testing.T, id string) sandbox.State {
	t.Helper()
	sb, err := e.m.Get(context.Background(), "", id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.State
}

// waitState polls until a sandbox reaches want, or fails after limit.
func (e *env) waitState(t *testing.T, id string, want sandbox.State, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if e.state(t, id) == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("sandbox %s is %s after %v, want %s", id, e.state(t, id), limit, want)
}

func TestSuspendResumeKeepsFilesAndTimers(t *testing.T) {
	e := open(t, newDir(t))
	ctx := context.Background()
	sb := e.create(t, sandbox.Spec{Timeout: time.Hour, IdleTimeout: -1})
	e.sh(t, sb.ID, "echo kept > /workspace/f; mkdir -p /opt/pkg && echo bin > /opt/pkg/bin")
	got, err := e.m.Suspend(ctx, "", sb.ID)
	if err != nil || got.State != sandbox.Suspended || got.Timers.Archive == nil {
		t.Fatalf("suspend: %+v %v", got, err)
	}
	if got.Spec.Timeout != time.Hour {
		t.Fatalf("suspend changed the timeout to %v", got.Spec.Timeout)
	}
	// Any call resumes it first (auto-resume), with its files.
	if out := e.sh(t, sb.ID, "cat /workspace/f /opt/pkg/bin"); out != "kept\nbin\n" {
		t.Fatalf("after auto-resume: %q", out)
	}
	after, _ := e.m.Get(ctx, "", sb.ID)
	if after.State != sandbox.Running || after.Spec.Timeout != time.Hour {
		t.Fatalf("after resume: %+v", after)
	}
}

func TestNoAutoResumeIsAConflict(t *testing.T) {
	e := open(t, newDir(t))
	ctx := context.Background()
	sb := e.create(t, sandbox.Spec{NoAutoResume: true, IdleTimeout: -1})
	if _, err := e.m.Pause(ctx, "", sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err := e.m.Live(ctx, "", sb.ID)
	var te *errdefs.TransitionError
	if !errors.As(err, &te) || te.From != "paused" {
		t.Fatalf("a call on a paused sandbox without auto-resume: %v", err)
	}
	if _, err := e.m.Resume(ctx, "", sb.ID); err != nil {
		t.Fatal(err)
	}
	e.sh(t, sb.ID, "true")
}

func TestPausedTimeDoesNotCountAgainstTimeout(t *testing.T) {
	e := open(t, newDir(t))
	ctx := context.Background()
	sb := e.create(t, sandbox.Spec{Timeout: 700 * time.Millisecond, IdleTimeout: -1})
	if _, err := e.m.Pause(ctx, "", sb.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond) // well past the timeout, but paused
	if st := e.state(t, sb.ID); st != sandbox.Paused {
		t.Fatalf("a paused sandbox timed out: %s", st)
	}
	if _, err := e.m.Resume(ctx, "", sb.ID); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, sb.ID, sandbox.Destroyed, 3*time.Second)
	got, _ := e.m.Get(ctx, "", sb.ID)
	if got.Reason != "timeout" || got.Timers.Used(time.Now()) < 700*time.Millisecond {
		t.Fatalf("destroyed: %+v", got)
	}
}

func TestTimeoutCanSuspendAndBeExtended(t *testing.T) {
	e := open(t, newDir(t))
	ctx := context.Background()
	sb := e.create(t, sandbox.Spec{Timeout: 500 * time.Millisecond, OnTimeout: "suspend", IdleTimeout: -1})
	longer := time.Hour
	if _, err := e.m.Update(ctx, "", sb.ID, sandbox.Patch{Timeout: &longer}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(900 * time.Millisecond)
	if st := e.state(t, sb.ID); st != sandbox.Running {
		t.Fatalf("an extended sandbox is %s", st)
	}
	shorter := 100 * time.Millisecond
	if _, err := e.m.Update(ctx, "", sb.ID, sandbox.Patch{Timeout: &shorter}); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, sb.ID, sandbox.Suspended, 3*time.Second)
}

func TestIdleDetection(t *testing.T) {
	e := open(t, newDir(t))
	idle := 600 * time.Millisecond
	busy := e.create(t, sandbox.Spec{IdleTimeout: idle})
	held := e.create(t, sandbox.Spec{IdleTimeout: idle})
	quiet := e.create(t, sandbox.Spec{IdleTimeout: idle})
	// A process that runs on (not a shell's child of a finished command:
	// started in the background, it stays in the sandbox).
	p, err := e.be.Exec(context.Background(), busy.ID, backend.ExecRequest{Cmd: "sleep 30", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	release := e.m.Hold(held.ID) // an open stream
	e.waitState(t, quiet.ID, sandbox.Suspended, 5*time.Second)
	time.Sleep(idle)
	if st := e.state(t, busy.ID); st != sandbox.Running {
		t.Fatalf("a sandbox running sleep 30 was called idle: %s", st)
	}
	if st := e.state(t, held.ID); st != sandbox.Running {
		t.Fatalf("a sandbox with an open stream was called idle: %s", st)
	}
	release()
	e.waitState(t, held.ID, sandbox.Suspended, 5*time.Second)
}

func TestRetireKeepsTheArchiveAndCanResume(t *testing.T) {
	e := open(t, newDir(t))
	ctx := context.Background()
	sb := e.create(t, sandbox.Spec{RetireAfter: 300 * time.Millisecond, IdleTimeout: -1})
	e.sh(t, sb.ID, "echo survived > /workspace/f")
	if _, err := e.m.Suspend(ctx, "", sb.ID); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, sb.ID, sandbox.Retired, 3*time.Second)
	if _, err := os.Stat(filepath.Join(e.dir, "sandboxes", sb.ID)); err == nil {
		t.Fatal("a retired sandbox kept its backend directory")
	}
	rc, a, err := e.m.OpenArchive(ctx, "", sb.ID)
	if err != nil || a.Size == 0 {
		t.Fatalf("archive of a retired sandbox: %+v %v", a, err)
	}
	rc.Close()
	if out := e.sh(t, sb.ID, "cat /workspace/f"); out != "survived\n" {
		t.Fatalf("resumed from retirement: %q", out)
	}
}

func TestTimersSurviveARestart(t *testing.T) {
	dir := newDir(t)
	e := open(t, dir)
	ctx := context.Background()
	sb, err := e.m.Create(ctx, "", sandbox.Spec{Timeout: 1500 * time.Millisecond, IdleTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	paused, err := e.m.Create(ctx, "", sandbox.Spec{IdleTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Pause(ctx, "", paused.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	e.close() // the daemon stops; sandboxes run on
	e2 := open(t, dir)
	if st := e2.state(t, paused.ID); st != sandbox.Paused {
		t.Fatalf("paused sandbox after restart: %s", st)
	}
	if _, err := e2.m.Resume(ctx, "", paused.ID); err != nil {
		t.Fatal(err)
	}
	e2.sh(t, paused.ID, "true")
	e2.waitState(t, sb.ID, sandbox.Destroyed, 3*time.Second)
	_ = e2.m.Delete(ctx, "", paused.ID)
}

func TestCreateFromArchive(t *testing.T) {
	e := open(t, newDir(t))
	ctx := context.Background()
	src := e.create(t, sandbox.Spec{IdleTimeout: -1})
	e.sh(t, src.ID, "echo from-archive > /workspace/f; mkdir -p /opt/app && echo bin > /opt/app/bin; sleep 300 >/dev/null 2>&1 &")
	if _, err := e.m.Create(ctx, "", sandbox.Spec{FromArchive: src.ID}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("from a sandbox never suspended: %v", err)
	}
	if _, err := e.m.Suspend(ctx, "", src.ID); err != nil {
		t.Fatal(err)
	}
	dup := e.create(t, sandbox.Spec{FromArchive: src.ID, IdleTimeout: -1})
	if got := e.sh(t, dup.ID, "cat /workspace/f /opt/app/bin; pgrep -c sleep || true"); got != "from-archive\nbin\n0\n" {
		t.Fatalf("the copy: %q (files kept, no processes)", got)
	}
	e.sh(t, dup.ID, "echo changed > /workspace/f")
	if got := e.sh(t, src.ID, "cat /workspace/f"); got != "from-archive\n" {
		t.Fatalf("the source after its copy changed: %q", got)
	}
	if _, err := e.m.Create(ctx, "other", sandbox.Spec{FromArchive: src.ID}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant from this archive: %v", err)
	}
}
