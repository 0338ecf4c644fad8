package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/api"
)

// TestDaemonRestart: sandboxes outlive their daemon. A new daemon on the
// same data directory finds a running sandbox with its files and
// processes, and records one whose init died meanwhile as failed.
func TestDaemonRestart(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	dir, err := traversableTempDir("hutch-restart-test-")
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", logs.String())
		}
	})
	d1, err := startDaemon(dir, filepath.Join(dir, "one.sock"), logs)
	if err != nil {
		t.Fatal(err)
	}
	current := d1
	t.Cleanup(func() {
		ctx := context.Background()
		sbs, _, _ := current.Manager.List(ctx, "", sandboxListAll)
		for _, sb := range sbs {
			_ = current.Manager.Delete(ctx, "", sb.ID)
		}
		_ = current.Stop()
		_ = os.RemoveAll(dir)
	})
	tenant, _ := newTenant(t, d1, "restart")
	c := local(t, d1)
	keep := newSandboxNoCleanup(t, tenant, api.CreateSandboxRequest{Labels: map[string]string{"k": "v"}})
	tenant.mustJSON("PUT", sbPath(keep, "/files?path=kept.txt"), "still here", 200, nil)
	var bg api.Process
	tenant.mustJSON("POST", sbPath(keep, "/processes"), api.StartProcessRequest{Cmd: "echo before; sleep 1000", Tag: "bg"}, 201, &bg)
	doomed := newSandboxNoCleanup(t, c, api.CreateSandboxRequest{})
	info, err := d1.Backend.Inspect(context.Background(), doomed)
	if err != nil || info.Pid <= 0 {
		t.Fatalf("inspect %s: %+v %v", doomed, info, err)
	}

	if err := d1.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	// While no daemon runs, one sandbox's init dies.
	if err := syscall.Kill(info.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill init %d: %v", info.Pid, err)
	}
	waitFor(t, "the killed init to go", 5*time.Second, func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(info.Pid) + "/stat")
		return err != nil || strings.Contains(string(b), ") Z ")
	})

	d2, err := startDaemon(dir, filepath.Join(dir, "two.sock"), logs)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	current = d2
	c = local(t, d2)
	tenant.base = "http://" + d2.TCPAddr // the key lives in the store: it still works

	var sb api.Sandbox
	tenant.mustJSON("GET", sbPath(keep, ""), nil, 200, &sb)
	if sb.State != api.Running || sb.Labels["k"] != "v" {
		t.Fatalf("after restart: %+v", sb)
	}
	if r := tenant.do("GET", sbPath(keep, "/files?path=kept.txt"), nil); string(r.Body) != "still here" {
		t.Fatalf("file after restart: %s", r)
	}
	var p api.Process
	tenant.mustJSON("GET", sbPath(keep, "/processes/bg"), nil, 200, &p)
	if !p.Running || p.Id != bg.Id || p.Pid != bg.Pid {
		t.Fatalf("process after restart: %+v, was %+v", p, bg)
	}
	if out := outputOf(streamEvents(t, tenant, keep, "bg", "")); out != "before\n" {
		t.Fatalf("its output after restart: %q", out)
	}
	if out := tenant.sh(keep, "cat kept.txt; pgrep -x sleep >/dev/null && echo sleeping"); out != "still heresleeping\n" {
		t.Fatalf("exec after restart: %q", out)
	}

	waitFor(t, "the dead sandbox to be recorded failed", 5*time.Second, func() bool {
		c.mustJSON("GET", sbPath(doomed, ""), nil, 200, &sb)
		return sb.State == api.Failed
	})
	if sb.Reason == "" {
		t.Fatalf("failed sandbox without a reason: %+v", sb)
	}
	c.wantErr("POST", sbPath(doomed, "/exec"), api.ExecRequest{Cmd: "true"}, "conflict")
	var fl api.SandboxList
	c.mustJSON("GET", "/v1/sandboxes?state=failed", nil, 200, &fl)
	if len(fl.Sandboxes) != 1 || fl.Sandboxes[0].Id != doomed {
		t.Fatalf("failed sandboxes: %+v", fl.Sandboxes)
	}
	// A failed sandbox can still be deleted, and then is gone for good.
	c.mustJSON("DELETE", sbPath(doomed, ""), nil, 204, nil)
	c.mustJSON("GET", sbPath(doomed, ""), nil, 200, &sb)
	if sb.State != api.Destroyed {
		t.Fatalf("deleted failed sandbox: %+v", sb)
	}
	// The metrics were seeded from the store.
	if m := string(mustGet(t, c, "/metrics")); !strings.Contains(m, `hutch_sandboxes{state="running"} 1`) {
		t.Errorf("metrics after restart lack one running sandbox:\n%s", grepLines(m, "hutch_sandboxes"))
	}
}

// newSandboxNoCleanup creates a sandbox whose deletion is the test's job.
func newSandboxNoCleanup(t testing.TB, c *client, req api.CreateSandboxRequest) string {
	t.Helper()
	var sb api.Sandbox
	c.mustJSON("POST", "/v1/sandboxes", req, 201, &sb)
	return sb.Id
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestInitDiesWhileServing: a sandbox whose init dies under a running
// daemon reads failed, with a reason, without anyone exec'ing in it.
func TestInitDiesWhileServing(t *testing.T) {
	t.Parallel()
	d := shared(t)
	c := local(t, d)
	id := newSandbox(t, c, api.CreateSandboxRequest{}).Id
	info, err := d.Backend.Inspect(context.Background(), id)
	if err != nil || info.Pid <= 0 {
		t.Fatalf("inspect: %+v %v", info, err)
	}
	if err := syscall.Kill(info.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var sb api.Sandbox
	waitFor(t, "the sandbox to read failed", 5*time.Second, func() bool {
		c.mustJSON("GET", sbPath(id, ""), nil, 200, &sb)
		return sb.State == api.Failed
	})
	if sb.Reason == "" {
		t.Fatalf("no reason: %+v", sb)
	}
	c.wantErr("GET", sbPath(id, "/processes"), nil, "conflict")
}
