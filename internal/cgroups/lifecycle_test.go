package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// TestCreateBusyLeavesFirstAlone: a second Create of an id whose group
// holds processes fails and changes nothing.
func TestCreateBusyLeavesFirstAlone(t *testing.T) {
	m := newManager(t)
	g := create(t, m, Limits{MemoryBytes: 64 << 20, Pids: 9})
	p := startIn(t, g, "sleep 30")
	_, err := m.Create(g.ID(), Limits{MemoryBytes: 32 << 20, Pids: 3})
	if !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second Create = %v, want ErrAlreadyExists", err)
	}
	st := statsOf(t, g)
	if st.PidsLimit != 9 || st.MemoryLimit != 64<<20 {
		t.Errorf("first group's limits changed: %+v", st)
	}
	if pids := mustPids(t, g); len(pids) == 0 || !slices.Contains(pids, p.cmd.Process.Pid) {
		t.Errorf("first group's processes: %v", pids)
	}
	for _, d := range g.dirs {
		if !exists(d.path) {
			t.Errorf("%s removed", d.path)
		}
	}
}

// TestCreateReusesLeftover: an empty group left by a crash (here frozen,
// with other limits) is reused and reset.
func TestCreateReusesLeftover(t *testing.T) {
	m := newManager(t)
	old := create(t, m, Limits{MemoryBytes: 64 << 20, Pids: 9, CPUMillis: 200})
	if err := old.Freeze(); err != nil {
		t.Fatal(err)
	}
	g, err := m.Create(old.ID(), Limits{MemoryBytes: 128 << 20})
	if err != nil {
		t.Fatalf("Create over leftover: %v", err)
	}
	st := statsOf(t, g)
	if st.MemoryLimit != 128<<20 || st.PidsLimit != 0 {
		t.Errorf("reused group limits: %+v", st)
	}
	if m.Mode() == V1 {
		checkFile(t, g.Path("freezer"), "freezer.state", "THAWED")
		checkFile(t, g.Path("cpu"), "cpu.cfs_quota_us", "-1")
	}
}

// TestCreateRollback: when a limit write fails after the directories were
// made, none is left.
func TestCreateRollback(t *testing.T) {
	m := newManager(t)
	id := testID()
	// pids.max above the kernel's PID_MAX_LIMIT (4M) is EINVAL.
	_, err := m.Create(id, Limits{MemoryBytes: 64 << 20, Pids: 1 << 30})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Create with pids.max 1<<30 = %v, want ErrInvalidArgument", err)
	}
	for _, p := range m.parents {
		if exists(filepath.Join(p.path, id)) {
			t.Errorf("%s left behind after: %v", filepath.Join(p.path, id), err)
		}
	}
}

func TestUpdate(t *testing.T) {
	m := newManager(t)
	g := create(t, m, Limits{MemoryBytes: 64 << 20, Pids: 9, CPUMillis: 1500})
	steps := []Limits{
		{MemoryBytes: 256 << 20, Pids: 20, CPUMillis: 250}, // memory up: memsw first
		{MemoryBytes: 32 << 20, Pids: 3, CPUMillis: 10},    // memory down: limit first
		{}, // all unlimited
		{MemoryBytes: 48 << 20},
	}
	for _, l := range steps {
		if err := g.Update(l); err != nil {
			t.Fatalf("Update(%+v): %v", l, err)
		}
		st := statsOf(t, g)
		if st.MemoryLimit != l.MemoryBytes || st.PidsLimit != l.Pids {
			t.Errorf("after Update(%+v): %+v", l, st)
		}
		if m.Mode() == V1 {
			quota := "-1"
			if l.CPUMillis > 0 {
				quota = fmt.Sprint(l.CPUMillis * 100)
			}
			checkFile(t, g.Path("cpu"), "cpu.cfs_quota_us", quota)
		}
	}
	if err := g.Update(Limits{Pids: -2}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Update(negative) = %v", err)
	}
}

// TestStatsCPU burns a little CPU and expects it accounted where the host
// can account it (v2, or v1 with cpuacct mounted together with cpu).
func TestStatsCPU(t *testing.T) {
	m := newManager(t)
	if d, ok := m.drv.(*v1); ok && !d.cpuacct {
		t.Skip("cpuacct is not co-mounted with cpu: no CPU usage on this v1 host")
	}
	g := create(t, m, Limits{})
	p := startIn(t, g, "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
	p.wait(t, 30*time.Second)
	if st := statsOf(t, g); st.CPUUsageNanos == 0 {
		t.Errorf("CPUUsageNanos = 0 after a busy loop")
	}
}

// BenchmarkCreateDelete is the daemon's per-sandbox cgroup cost, with every
// limit set.
func BenchmarkCreateDelete(b *testing.B) {
	m := newManager(b)
	l := Limits{MemoryBytes: 256 << 20, Pids: 64, CPUMillis: 1000}
	prefix := fmt.Sprintf("bench-%d-", os.Getpid())
	for i := 0; b.Loop(); i++ {
		g, err := m.Create(fmt.Sprint(prefix, i), l)
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Delete(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMissingControllers: New's error names what is missing. The mount
// list is made up; nothing is created.
func TestMissingControllers(t *testing.T) {
	mounts := []mount{{point: "/x/cpu", root: "/", fstype: "cgroup", opts: []string{"rw", "cpu"}}}
	_, err := newV1(Options{}, mounts, map[string]string{"cpu": "/"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "memory, pids") {
		t.Fatalf("newV1 without memory and pids = %v", err)
	}
}

func TestMountDir(t *testing.T) {
	m := mount{point: "/sys/fs/cgroup/memory", root: "/docker/abc"}
	if d, ok := m.dir("/docker/abc/sub"); !ok || d != "/sys/fs/cgroup/memory/sub" {
		t.Errorf("dir = %q %v", d, ok)
	}
	if _, ok := m.dir("/docker/abcd"); ok {
		t.Error("path outside the mount root accepted")
	}
	if got := unescape(`/a\040b`); got != "/a b" {
		t.Errorf("unescape = %q", got)
	}
}
