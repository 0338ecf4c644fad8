package hutch_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/hutch-dev/hutch/internal/daemon"
	"github.com/hutch-dev/hutch/internal/daemon/daemontest"
	hutch "github.com/hutch-dev/hutch/sdk"
)

// TestLifecycle runs the lifecycle tests against one real daemon, in
// parallel.
func TestLifecycle(t *testing.T) {
	d := daemontest.Start(t)
	sock, err := hutch.New("unix://"+d.Socket, "")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{d: d, sock: sock}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, *env)
	}{
		{"PauseResume", testPauseResume}, {"Suspend", testSuspend}, {"Timers", testTimers},
		{"NoAutoResume", testNoAutoResume}, {"SandboxArchive", testSandboxArchive},
		{"Refused", testLifecycleRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.f(t, e)
		})
	}
}

func wantState(t *testing.T, c *hutch.Client, id string, want hutch.State) *hutch.Sandbox {
	t.Helper()
	sb, err := c.Get(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != want {
		t.Fatalf("sandbox %s is %s, want %s", id, sb.State, want)
	}
	return sb
}

func sh(t *testing.T, sb *hutch.Sandbox, cmd string) string {
	t.Helper()
	res, err := sb.Exec(ctxT(t), cmd)
	if err != nil {
		t.Fatalf("%q: %v", cmd, err)
	}
	if res.Code() != 0 {
		t.Fatalf("%q: exit %d: %s%s", cmd, res.Code(), res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

func testPauseResume(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	if _, err := sb.StartProcess(ctx, "sleep 1000", hutch.ProcessOptions{Tag: "sleeper"}); err != nil {
		t.Fatal(err)
	}
	got, err := sb.Pause(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got != sb || sb.State != hutch.StatePaused {
		t.Fatalf("pause returned %p (receiver %p) in state %s", got, sb, sb.State)
	}
	if _, err := sb.Pause(ctx); err != nil || sb.State != hutch.StatePaused {
		t.Fatalf("pausing a paused sandbox: %v, %s", err, sb.State)
	}
	// Paused time is not used up: the account stands still.
	used := wantState(t, e.sock, sb.ID, hutch.StatePaused).TimeUsed
	time.Sleep(1200 * time.Millisecond)
	if again := wantState(t, e.sock, sb.ID, hutch.StatePaused).TimeUsed; again != used || used <= 0 {
		t.Fatalf("time used while paused: %v then %v", used, again)
	}

	// Exec resumes it; the background process lived through the pause.
	if out := sh(t, e.sock.Sandbox(sb.ID), "echo back"); out != "back\n" {
		t.Fatalf("exec on a paused sandbox: %q", out)
	}
	wantState(t, e.sock, sb.ID, hutch.StateRunning)
	if p, err := sb.Process(ctx, "sleeper"); err != nil || !p.Running {
		t.Fatalf("the paused process: %+v, %v", p, err)
	}

	// An explicit resume; resuming a running sandbox succeeds.
	if _, err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Resume(ctx); err != nil || sb.State != hutch.StateRunning {
		t.Fatalf("resume: %v, %s", err, sb.State)
	}
	if _, err := sb.Resume(ctx); err != nil || sb.State != hutch.StateRunning {
		t.Fatalf("resuming a running sandbox: %v, %s", err, sb.State)
	}
	if p, err := sb.Process(ctx, "sleeper"); err != nil || !p.Running {
		t.Fatalf("the paused process after resume: %+v, %v", p, err)
	}
}

func testSuspend(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	if err := sb.WriteFile(ctx, "notes/a.txt", []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	sh(t, sb, `mkdir -p /opt/tool && printf '#!/bin/sh\necho tool ran\n' > /opt/tool/run && chmod 0750 /opt/tool/run &&
		echo etc > /etc/added.conf && rm /etc/resolv.conf`)
	if _, err := sb.StartProcess(ctx, "sleep 1000", hutch.ProcessOptions{Tag: "sleeper"}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	if sb.State != hutch.StateSuspended || sb.Archive == nil || sb.Archive.Size <= 0 ||
		len(sb.Archive.SHA256) != 64 || sb.Archive.Bytes <= 0 || sb.Archive.CreatedAt.IsZero() {
		t.Fatalf("suspended: %s, archive %+v", sb.State, sb.Archive)
	}
	if _, err := sb.Suspend(ctx); err != nil || sb.State != hutch.StateSuspended {
		t.Fatalf("suspending a suspended sandbox: %v, %s", err, sb.State)
	}
	wantState(t, e.sock, sb.ID, hutch.StateSuspended)

	if _, err := sb.Resume(ctx); err != nil || sb.State != hutch.StateRunning {
		t.Fatalf("resume: %v, %s", err, sb.State)
	}
	if data, err := sb.ReadFile(ctx, "notes/a.txt"); err != nil || string(data) != "kept" {
		t.Fatalf("/workspace after resume: %q, %v", data, err)
	}
	if fi, err := sb.Stat(ctx, "notes/a.txt"); err != nil || fi.Mode.Perm() != 0o600 {
		t.Fatalf("mode after resume: %+v, %v", fi, err)
	}
	out := sh(t, sb, "stat -c %a /opt/tool/run; /opt/tool/run; cat /etc/added.conf; test -e /etc/resolv.conf || echo gone")
	if out != "750\ntool ran\netc\ngone\n" {
		t.Fatalf("files outside /workspace after resume: %q", out)
	}
	// Processes are not kept.
	if p, err := sb.Process(ctx, "sleeper"); err == nil && p.Running {
		t.Fatalf("a process survived suspension: %+v", p)
	}

	// A call on a suspended sandbox resumes it (auto-resume is the default).
	if _, err := sb.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	if data, err := e.sock.Sandbox(sb.ID).ReadFile(ctx, "/opt/tool/run"); err != nil || !strings.Contains(string(data), "tool ran") {
		t.Fatalf("read on a suspended sandbox: %q, %v", data, err)
	}
	wantState(t, e.sock, sb.ID, hutch.StateRunning)
}

func testTimers(t *testing.T, e *env) {
	ctx := ctxT(t)
	def := sandbox(t, e.sock, hutch.CreateOptions{})
	if def.OnTimeout != "destroy" || def.IdleTimeoutSeconds != 300 || def.RetireAfterSeconds != 18000 ||
		!def.AutoResume || def.TimeoutSeconds != 0 || def.Archive != nil {
		t.Fatalf("defaults: %+v", def)
	}

	no := false
	sb := sandbox(t, e.sock, hutch.CreateOptions{Timeout: time.Hour, OnTimeout: "suspend",
		IdleTimeout: 10 * time.Minute, RetireAfter: -1, AutoResume: &no})
	if sb.TimeoutSeconds != 3600 || sb.OnTimeout != "suspend" || sb.IdleTimeoutSeconds != 600 ||
		sb.RetireAfterSeconds != -1 || sb.AutoResume {
		t.Fatalf("created with timers: %+v", sb)
	}
	got, err := e.sock.Get(ctx, sb.ID)
	if err != nil || got.IdleTimeoutSeconds != 600 || got.RetireAfterSeconds != -1 || got.AutoResume || got.OnTimeout != "suspend" {
		t.Fatalf("get: %+v, %v", got, err)
	}

	two, never, retire, destroy, yes := 2*time.Hour, time.Duration(-1), 90*time.Minute, "destroy", true
	if _, err := sb.Update(ctx, hutch.UpdateOptions{Timeout: &two, OnTimeout: &destroy, IdleTimeout: &never,
		RetireAfter: &retire, AutoResume: &yes}); err != nil {
		t.Fatal(err)
	}
	if sb.TimeoutSeconds != 7200 || sb.OnTimeout != "destroy" || sb.IdleTimeoutSeconds != -1 ||
		sb.RetireAfterSeconds != 5400 || !sb.AutoResume {
		t.Fatalf("updated: %+v", sb)
	}
	got, err = e.sock.Get(ctx, sb.ID)
	if err != nil || got.TimeoutSeconds != 7200 || got.OnTimeout != "destroy" || got.IdleTimeoutSeconds != -1 ||
		got.RetireAfterSeconds != 5400 || !got.AutoResume || got.State != hutch.StateRunning || got.TimeUsed <= 0 {
		t.Fatalf("get after update: %+v, %v", got, err)
	}

	// Absent fields stay; 0 brings back the daemon's default; durations
	// round up to whole seconds.
	zero, odd := time.Duration(0), 1500*time.Millisecond
	if _, err := sb.Update(ctx, hutch.UpdateOptions{IdleTimeout: &zero, RetireAfter: &odd}); err != nil {
		t.Fatal(err)
	}
	if sb.IdleTimeoutSeconds != 300 || sb.RetireAfterSeconds != 2 || sb.TimeoutSeconds != 7200 || sb.OnTimeout != "destroy" {
		t.Fatalf("partial update: %+v", sb)
	}

	// A timeout that suspends; raising it lets the sandbox run again.
	quick := sandbox(t, e.sock, hutch.CreateOptions{Timeout: time.Second, OnTimeout: "suspend"})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := quick.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if quick.State == hutch.StateSuspended {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a timed-out sandbox is %s, want suspended", quick.State)
		}
	}
	if quick.Archive == nil || quick.TimeUsed < time.Second {
		t.Fatalf("timed out: archive %+v, used %v", quick.Archive, quick.TimeUsed)
	}
	if _, err := quick.Update(ctx, hutch.UpdateOptions{Timeout: &two}); err != nil {
		t.Fatal(err)
	}
	if _, err := quick.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // a few reaper rounds
	wantState(t, e.sock, quick.ID, hutch.StateRunning)

	// Refused values.
	bad, neg := "explode", -time.Second
	_, err = def.Update(ctx, hutch.UpdateOptions{OnTimeout: &bad})
	wantErr(t, err, hutch.ErrInvalidArgument, "invalid_argument")
	_, err = def.Update(ctx, hutch.UpdateOptions{Timeout: &neg})
	wantErr(t, err, hutch.ErrInvalidArgument, "invalid_argument")
	if def.OnTimeout != "destroy" || def.TimeoutSeconds != 0 {
		t.Fatalf("a failed update changed the receiver: %+v", def)
	}
	_, err = e.sock.Create(ctx, hutch.CreateOptions{OnTimeout: "explode"})
	wantErr(t, err, hutch.ErrInvalidArgument, "invalid_argument")
	_, err = e.sock.Sandbox("no-such-sandbox").Update(ctx, hutch.UpdateOptions{Timeout: &two})
	wantErr(t, err, hutch.ErrNotFound, "not_found")
}

func testNoAutoResume(t *testing.T, e *env) {
	ctx := ctxT(t)
	no := false
	sb := sandbox(t, e.sock, hutch.CreateOptions{AutoResume: &no})
	if _, err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := sb.Exec(ctx, "true")
	wantErr(t, err, hutch.ErrConflict, "conflict")
	var he *hutch.Error
	if !errors.As(err, &he) || he.From != "paused" || he.To != "running" {
		t.Fatalf("the conflict does not name the states: %#v", he)
	}
	_, err = sb.ReadFile(ctx, "/etc/hostname")
	wantErr(t, err, hutch.ErrConflict, "conflict")
	wantState(t, e.sock, sb.ID, hutch.StatePaused)

	// Suspended, the same; an explicit resume still works.
	if _, err := sb.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = sb.Exec(ctx, "true")
	wantErr(t, err, hutch.ErrConflict, "conflict")
	wantState(t, e.sock, sb.ID, hutch.StateSuspended)
	if _, err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	sh(t, sb, "true")
}

func testSandboxArchive(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	_, _, err := sb.DownloadSandboxArchive(ctx)
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	if err := sb.WriteFile(ctx, "hello.txt", []byte("hello archive"), 0); err != nil {
		t.Fatal(err)
	}
	sh(t, sb, "mkdir -p /opt/x && echo opt > /opt/x/y")
	if _, err := sb.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	rc, info, err := e.sock.Sandbox(sb.ID).DownloadSandboxArchive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(rc)
	if cerr := rc.Close(); err != nil || cerr != nil {
		t.Fatalf("read the archive: %v, %v", err, cerr)
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != info.SHA256 || info.SHA256 != sb.Archive.SHA256 ||
		int64(len(data)) != info.Size || info.Size != sb.Archive.Size {
		t.Fatalf("archive of %d bytes, sha256 %x; info %+v; sandbox's %+v", len(data), sum, info, sb.Archive)
	}
	// With the sandbox as last seen, the info is complete.
	_, full, err := sb.DownloadSandboxArchive(ctx)
	if err != nil || full != *sb.Archive {
		t.Fatalf("info %+v, want %+v (%v)", full, *sb.Archive, err)
	}

	// A zstd tar of the writable layer, owners relative to the sandbox.
	zr, err := zstd.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	var raw bytes.Buffer
	tr := tar.NewReader(io.TeeReader(zr, &raw))
	found := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		if name == "workspace/hello.txt" || name == "opt/x/y" {
			b, _ := io.ReadAll(tr)
			found[name] = string(b)
			if h.Uid != 0 || h.Gid != 0 {
				t.Fatalf("%s is owned by %d:%d in the archive, want the sandbox's root", name, h.Uid, h.Gid)
			}
		}
	}
	_, _ = io.Copy(&raw, zr)
	if found["workspace/hello.txt"] != "hello archive" || found["opt/x/y"] != "opt\n" {
		t.Fatalf("archive entries: %q", found)
	}
	if int64(raw.Len()) != sb.Archive.Bytes {
		t.Fatalf("uncompressed %d bytes, sandbox says %d", raw.Len(), sb.Archive.Bytes)
	}
}

func testLifecycleRefused(t *testing.T, e *env) {
	ctx := ctxT(t)
	ghost := e.sock.Sandbox("no-such-sandbox")
	for name, op := range map[string]func() (*hutch.Sandbox, error){
		"pause":   func() (*hutch.Sandbox, error) { return ghost.Pause(ctx) },
		"suspend": func() (*hutch.Sandbox, error) { return ghost.Suspend(ctx) },
		"resume":  func() (*hutch.Sandbox, error) { return ghost.Resume(ctx) },
	} {
		_, err := op()
		if !errors.Is(err, hutch.ErrNotFound) {
			t.Fatalf("%s of a missing sandbox: %v", name, err)
		}
	}
	_, _, err := ghost.DownloadSandboxArchive(ctx)
	wantErr(t, err, hutch.ErrNotFound, "not_found")

	// Another tenant's sandbox is missing too.
	a, b := e.tcpClient(t, "life-a"), e.tcpClient(t, "life-b")
	mine := sandbox(t, a, hutch.CreateOptions{})
	_, err = b.Sandbox(mine.ID).Pause(ctx)
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	if _, err := a.Sandbox(mine.ID).Pause(ctx); err != nil {
		t.Fatalf("pause over TCP: %v", err)
	}

	// A destroyed sandbox moves nowhere: a TransitionError is a conflict.
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	for name, op := range map[string]func() (*hutch.Sandbox, error){
		"pause":   func() (*hutch.Sandbox, error) { return sb.Pause(ctx) },
		"suspend": func() (*hutch.Sandbox, error) { return sb.Suspend(ctx) },
		"resume":  func() (*hutch.Sandbox, error) { return sb.Resume(ctx) },
	} {
		_, err := op()
		if !errors.Is(err, hutch.ErrConflict) {
			t.Fatalf("%s of a destroyed sandbox: %v", name, err)
		}
		wantErr(t, err, hutch.ErrConflict, "conflict")
	}
	if sb.State != hutch.StateRunning {
		t.Fatalf("a refused call changed the receiver: %s", sb.State)
	}
}

// TestSuspendOverCap: an archive over the daemon's cap fails the suspend
// with ErrResourceExhausted and leaves the sandbox running, processes and
// all.
func TestSuspendOverCap(t *testing.T) {
	d := daemontest.Start(t, func(c *daemon.Config) { c.ArchiveCap = 100 << 10 })
	c, err := hutch.New("unix://"+d.Socket, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	sb := sandbox(t, c, hutch.CreateOptions{})
	if _, err := sb.StartProcess(ctx, "sleep 1000", hutch.ProcessOptions{Tag: "sleeper"}); err != nil {
		t.Fatal(err)
	}
	sum := sh(t, sb, "head -c 2097152 /dev/urandom > /workspace/random && sha256sum < /workspace/random")
	_, err = sb.Suspend(ctx)
	wantErr(t, err, hutch.ErrResourceExhausted, "resource_exhausted")
	if sb.State != hutch.StateRunning {
		t.Fatalf("a failed suspend changed the receiver: %s", sb.State)
	}
	got := wantState(t, c, sb.ID, hutch.StateRunning)
	if got.Archive != nil {
		t.Fatalf("a failed suspend left an archive: %+v", got.Archive)
	}
	if p, err := sb.Process(ctx, "sleeper"); err != nil || !p.Running {
		t.Fatalf("the process after a failed suspend: %+v, %v", p, err)
	}
	if again := sh(t, sb, "sha256sum < /workspace/random"); again != sum {
		t.Fatalf("the data after a failed suspend: %q, want %q", again, sum)
	}
	_, _, err = sb.DownloadSandboxArchive(ctx)
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	// Small enough, it suspends.
	sh(t, sb, "rm /workspace/random")
	if _, err := sb.Suspend(ctx); err != nil {
		t.Fatalf("suspend under the cap: %v", err)
	}
}

func TestSandboxJSON(t *testing.T) {
	in := hutch.Sandbox{ID: "x", State: hutch.StateSuspended, TimeUsed: 1500 * time.Millisecond,
		IdleTimeoutSeconds: -1, Archive: &hutch.ArchiveInfo{Size: 3, SHA256: "ab", Bytes: 9}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"time_used":1.5`, `"idle_timeout":-1`, `"auto_resume":false`, `"sha256":"ab"`} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("%s lacks %s", b, want)
		}
	}
	var out hutch.Sandbox
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.TimeUsed != in.TimeUsed || out.ID != "x" || out.IdleTimeoutSeconds != -1 || *out.Archive != *in.Archive {
		t.Fatalf("round trip: %+v", out)
	}
	// A pointer marshals the same.
	if b2, _ := json.Marshal(&in); !bytes.Equal(b, b2) {
		t.Fatalf("pointer: %s, value: %s", b2, b)
	}
}
