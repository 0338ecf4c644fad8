package cgroups

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

func TestModeDetection(t *testing.T) {
	m := newManager(t)
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		t.Fatal(err)
	}
	want := V1 // a tmpfs of v1 hierarchies (legacy or hybrid)
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		want = V2
	}
	if m.Mode() != want {
		t.Fatalf("Mode() = %v, want %v", m.Mode(), want)
	}
	if V1.String() != "v1" || V2.String() != "v2" {
		t.Errorf("String: %q %q", V1, V2)
	}
}

// TestCreateV1Layout checks that a group gets a directory in exactly the
// memory, pids, cpu and freezer hierarchies, nested under the daemon's own
// cgroup, with the limits written.
func TestCreateV1Layout(t *testing.T) {
	m := newManager(t)
	if m.Mode() != V1 {
		t.Skip("v1 layout test on a v2 host")
	}
	g := create(t, m, Limits{MemoryBytes: 64 << 20, Pids: 10, CPUMillis: 500})
	mounts, err := readMounts()
	if err != nil {
		t.Fatal(err)
	}
	used := []string{"memory", "pids", "cpu", "freezer"}
	for _, mnt := range mounts {
		own := cgroupOf(t, "/proc/self", "")
		if mnt.fstype == "cgroup" {
			own = cgroupOf(t, "/proc/self", mnt.opts[len(mnt.opts)-1])
		}
		dir, _ := mnt.dir(own)
		dir = filepath.Join(dir, "hutch", g.ID())
		ctrl := ""
		for _, c := range used {
			if mnt.fstype == "cgroup" && slices.Contains(mnt.opts, c) {
				ctrl = c
			}
		}
		if got := exists(dir); got != (ctrl != "") {
			t.Errorf("%s exists = %v, want %v", dir, got, ctrl != "")
		}
		if ctrl != "" && g.Path(ctrl) != dir {
			t.Errorf("Path(%s) = %q, want %q", ctrl, g.Path(ctrl), dir)
		}
	}
	if !strings.HasPrefix(g.Path("memory"), "/sys/fs/cgroup/memory/") {
		t.Errorf("Path(memory) = %q", g.Path("memory"))
	}
	if g.Path("cpuset") != "" {
		t.Errorf("Path(cpuset) = %q, want none", g.Path("cpuset"))
	}
	checkFile(t, g.Path("memory"), "memory.limit_in_bytes", "67108864")
	if m.drv.(*v1).memsw {
		checkFile(t, g.Path("memory"), "memory.memsw.limit_in_bytes", "67108864")
	}
	checkFile(t, g.Path("pids"), "pids.max", "10")
	checkFile(t, g.Path("cpu"), "cpu.cfs_quota_us", "50000")
	checkFile(t, g.Path("cpu"), "cpu.cfs_period_us", "100000")
	checkFile(t, g.Path("freezer"), "freezer.state", "THAWED")
}

func checkFile(t *testing.T, dir, file, want string) {
	t.Helper()
	if got := readTrim(t, filepath.Join(dir, file)); got != want {
		t.Errorf("%s = %q, want %q", file, got, want)
	}
}

// TestAddProc moves a multi-threaded process (a Go helper) and checks
// every thread landed in the group in every controller.
func TestAddProc(t *testing.T) {
	m := newManager(t)
	g := create(t, m, Limits{Pids: 64})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), helperEnv+"=sleep")
	p := start(t, cmd)
	pid := p.cmd.Process.Pid
	time.Sleep(50 * time.Millisecond) // let the Go runtime start its threads
	if err := g.AddProc(pid); err != nil {
		t.Fatalf("AddProc: %v", err)
	}
	if pids := mustPids(t, g); !slices.Equal(pids, []int{pid}) {
		t.Fatalf("Pids = %v, want [%d]", pids, pid)
	}
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*"))
	if err != nil || len(tasks) < 2 {
		t.Fatalf("helper threads: %v %v", tasks, err)
	}
	for _, d := range g.dirs {
		for _, task := range tasks {
			got := cgroupOf(t, task, d.name)
			if !strings.HasSuffix(got, "/"+g.ID()) {
				t.Errorf("thread %s in %s cgroup %q", filepath.Base(task), d.name, got)
			}
		}
	}
	if err := g.AddProc(0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("AddProc(0) = %v, want ErrInvalidArgument", err)
	}
}

// TestPidsLimit: with pids.max 5 a shell in the group gets four sleeps
// started (itself being the fifth task) and the next fork fails.
func TestPidsLimit(t *testing.T) {
	m := newManager(t)
	g := create(t, m, Limits{Pids: 5})
	startIn(t, g, "for i in 1 2 3 4 5 6 7 8; do sleep 30 & done; wait")
	st := statsOf(t, g)
	if st.PidsLimit != 5 {
		t.Errorf("PidsLimit = %d", st.PidsLimit)
	}
	// The kernel counts refused forks in pids.events; the forked children
	// may still be execing sleep, so wait for the end state.
	var failed int64
	sleeps := 0
	waitFor(t, "4 sleeps and a refused fork", func() bool {
		failed, _ = readKey(filepath.Join(g.Path("pids"), "pids.events"), "max")
		sleeps = 0
		for _, c := range comms(mustPids(t, g)) {
			if c == "sleep" {
				sleeps++
			}
		}
		return failed > 0 && sleeps == 4
	})
	if st := statsOf(t, g); st.Pids > 5 {
		t.Errorf("pids.current = %d, want <= 5", st.Pids)
	}
	time.Sleep(20 * time.Millisecond)
	if n := len(mustPids(t, g)); n > 5 {
		t.Errorf("%d processes in the group, limit 5", n)
	}
	t.Logf("pids.events max = %d", failed)
}

// TestOOMKill: a process limited to 32 MiB that touches a 100 MB buffer is
// killed by the kernel, and Stats counts it.
func TestOOMKill(t *testing.T) {
	m := newManager(t)
	g := create(t, m, Limits{MemoryBytes: 32 << 20, Pids: 16})
	p := startIn(t, g, "exec dd if=/dev/zero of=/dev/null bs=100M count=1")
	err := p.wait(t, 30*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !killed(ee) {
		t.Fatalf("dd exited with %v, want SIGKILL", err)
	}
	st := statsOf(t, g)
	if st.OOMKills < 1 {
		t.Errorf("OOMKills = %d, want > 0", st.OOMKills)
	}
	if st.MemoryLimit != 32<<20 {
		t.Errorf("MemoryLimit = %d", st.MemoryLimit)
	}
	t.Logf("stats after OOM: %+v", st)
}

func killed(ee *exec.ExitError) bool {
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

func statsOf(t *testing.T, g *Group) Stats {
	t.Helper()
	st, err := g.Stats()
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return st
}

// TestFreezeThaw freezes a busy loop and checks it gets no CPU while frozen.
func TestFreezeThaw(t *testing.T) {
	m := newManager(t)
	g := create(t, m, Limits{Pids: 16})
	p := startIn(t, g, "while :; do :; done")
	if err := g.Freeze(); err != nil {
		t.Fatalf("Freeze: %v", err)
	}
	if m.Mode() == V1 {
		checkFile(t, g.Path("freezer"), "freezer.state", "FROZEN")
	}
	before := cpuTicks(t, p.cmd.Process.Pid)
	time.Sleep(100 * time.Millisecond)
	if after := cpuTicks(t, p.cmd.Process.Pid); after != before {
		t.Errorf("frozen process used CPU: %d -> %d ticks", before, after)
	}
	if err := g.Thaw(); err != nil {
		t.Fatalf("Thaw: %v", err)
	}
	if m.Mode() == V1 {
		checkFile(t, g.Path("freezer"), "freezer.state", "THAWED")
	}
	waitFor(t, "the thawed loop to run", func() bool { return cpuTicks(t, p.cmd.Process.Pid) > before })
}

// cpuTicks is utime+stime from /proc/pid/stat.
func cpuTicks(t *testing.T, pid int) int {
	t.Helper()
	s := readTrim(t, filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.Atoi(f[11])
	k, _ := strconv.Atoi(f[12])
	return u + k
}

// TestKill kills a shell that forks as fast as it can, at its pids limit.
func TestKill(t *testing.T) {
	m := newManager(t)
	g := create(t, m, Limits{Pids: 32})
	p := startIn(t, g, "while :; do sleep 30 & done")
	waitFor(t, "the fork loop to fill the group", func() bool { return len(mustPids(t, g)) > 10 })
	if err := g.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if pids := mustPids(t, g); len(pids) != 0 {
		t.Fatalf("after Kill: %v", pids)
	}
	p.wait(t, 5*time.Second)
	if err := g.Kill(); err != nil {
		t.Errorf("Kill of an empty group: %v", err)
	}
}

func TestDeleteIdempotent(t *testing.T) {
	m := newManager(t)
	g, err := m.Create(testID(), Limits{MemoryBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := g.Delete(); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	assertGone(t, g)
	if _, err := m.Load(g.ID()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Load after Delete = %v, want ErrNotFound", err)
	}
}

func TestDeleteKillsRunning(t *testing.T) {
	m := newManager(t)
	g, err := m.Create(testID(), Limits{Pids: 16})
	if err != nil {
		t.Fatal(err)
	}
	p := startIn(t, g, "sleep 30 & sleep 30")
	waitFor(t, "three processes", func() bool { return len(mustPids(t, g)) == 3 })
	if err := g.Delete(); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	assertGone(t, g)
	err = p.wait(t, 5*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !killed(ee) {
		t.Errorf("shell exited with %v, want SIGKILL", err)
	}
}

func TestLoad(t *testing.T) {
	m := newManager(t)
	g := create(t, m, Limits{Pids: 7})
	l, err := m.Load(g.ID())
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	for _, c := range []string{"memory", "pids", "cpu", "freezer"} {
		if l.Path(c) != g.Path(c) {
			t.Errorf("Path(%s) = %q, want %q", c, l.Path(c), g.Path(c))
		}
	}
	if st := statsOf(t, l); st.PidsLimit != 7 {
		t.Errorf("loaded PidsLimit = %d", st.PidsLimit)
	}
	if _, err := m.Load("no-such-group"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Load(missing) = %v, want ErrNotFound", err)
	}
}

func TestInvalidArguments(t *testing.T) {
	m := newManager(t)
	for _, id := range []string{"", "Upper", "a/b", "..", "a_b", "a.b", strings.Repeat("a", 65)} {
		if _, err := m.Create(id, Limits{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Create(%q) = %v, want ErrInvalidArgument", id, err)
		}
		if _, err := m.Load(id); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Load(%q) = %v, want ErrInvalidArgument", id, err)
		}
	}
	for _, l := range []Limits{{MemoryBytes: -1}, {Pids: -1}, {CPUMillis: 5}, {CPUMillis: -1}} {
		if _, err := m.Create(testID(), l); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Create(%+v) = %v, want ErrInvalidArgument", l, err)
		}
	}
	if _, err := New(Options{Parent: "a/../../b"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("New(Parent with ..) = %v, want ErrInvalidArgument", err)
	}
	if _, err := m.Create(strings.Repeat("a", 64), Limits{}); err != nil {
		t.Errorf("64-char id: %v", err)
	} else if g, err := m.Load(strings.Repeat("a", 64)); err == nil {
		_ = g.Delete()
	}
}
