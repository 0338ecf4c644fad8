package cgroups

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// TestV2Mechanics drives the v2 code on a hybrid host's cgroup2 mount. It
// has no controllers, so no limits or stats, but it has everything else:
// cgroup.procs, cgroup.freeze, cgroup.kill and cgroup.events.
func TestV2Mechanics(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups tests need root to create cgroups")
	}
	if cgroups.Mode() != cgroups.Hybrid {
		t.Skip("needs a hybrid host's spare cgroup2 mount (on a v2 host the other tests cover v2)")
	}
	mounts, err := readMounts()
	if err != nil {
		t.Fatal(err)
	}
	mnt, ok := findMount(mounts, "cgroup2", "")
	if !ok {
		t.Skip("no cgroup2 mount")
	}
	parent := fmt.Sprintf("hutch-v2test-%d", os.Getpid())
	t.Cleanup(func() { _ = os.Remove(filepath.Join(mnt.point, parent)) })
	m, err := newV2(Options{Parent: parent}, mnt, "", false)
	if err != nil {
		t.Fatalf("newV2: %v", err)
	}
	g := create(t, m, Limits{})
	if want := filepath.Join(mnt.point, parent, g.ID()); g.Path("memory") != want || g.Path("") != want {
		t.Fatalf("Path = %q, want %q", g.Path("memory"), want)
	}
	if _, err := m.Create(testID(), Limits{CPUMillis: 100}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("CPU limit without the cpu controller = %v, want ErrFailedPrecondition", err)
	}

	p := startIn(t, g, "sleep 30 & sleep 30")
	waitFor(t, "three processes", func() bool { return len(mustPids(t, g)) == 3 })
	if got := cgroupOf(t, fmt.Sprint("/proc/", p.cmd.Process.Pid), ""); !strings.HasSuffix(got, "/"+g.ID()) {
		t.Errorf("shell's cgroup2 path = %q", got)
	}
	if _, err := m.Create(g.ID(), Limits{}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Create over a busy group = %v, want ErrAlreadyExists", err)
	}

	events := filepath.Join(g.Path(""), "cgroup.events")
	if err := g.Freeze(); err != nil {
		t.Fatalf("Freeze: %v", err)
	}
	if n, _ := readKey(events, "frozen"); n != 1 {
		t.Errorf("frozen = %d after Freeze", n)
	}
	if err := g.Thaw(); err != nil {
		t.Fatalf("Thaw: %v", err)
	}
	waitFor(t, "thaw", func() bool { n, _ := readKey(events, "frozen"); return n == 0 })

	if err := g.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if pids := mustPids(t, g); len(pids) != 0 {
		t.Errorf("after Kill: %v", pids)
	}
	var ee *exec.ExitError
	if err := p.wait(t, 5*time.Second); !errors.As(err, &ee) || !killed(ee) {
		t.Errorf("shell exited with %v, want SIGKILL", err)
	}
	for range 2 {
		if err := g.Delete(); err != nil {
			t.Fatalf("Delete: %v", err)
		}
	}
	assertGone(t, g)
	if _, err := m.Load(g.ID()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Load after Delete = %v", err)
	}
}
