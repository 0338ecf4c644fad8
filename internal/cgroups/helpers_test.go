package cgroups

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// helperEnv makes the test binary, re-executed, act as a multi-threaded
// sleeper (a Go process always runs several threads).
const helperEnv = "HUTCH_CGROUPS_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "sleep" {
		time.Sleep(30 * time.Second)
		os.Exit(0)
	}
	made := defaultParentsToRemove()
	code := m.Run()
	for _, dir := range made {
		_ = os.Remove(dir) // fails harmlessly if someone else uses it now
	}
	os.Exit(code)
}

// defaultParentsToRemove lists the default parent dirs ("<own>/hutch")
// that do not exist yet, so the tests can remove the ones they make.
func defaultParentsToRemove() []string {
	if os.Geteuid() != 0 {
		return nil
	}
	m, err := New(Options{})
	if err != nil {
		return nil
	}
	var out []string
	for _, p := range m.parents {
		if !exists(p.path) {
			out = append(out, p.path)
		}
	}
	return out
}

// newManager returns a Manager with default options, or skips the test
// when it cannot work here.
func newManager(tb testing.TB) *Manager {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("cgroups tests need root to create cgroups")
	}
	m, err := New(Options{})
	if errors.Is(err, errdefs.ErrFailedPrecondition) {
		tb.Skipf("no usable cgroup controllers: %v", err)
	}
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return m
}

var seq atomic.Int64

func testID() string {
	return fmt.Sprintf("test-%d-%d", os.Getpid(), seq.Add(1))
}

// create makes a group that is deleted when the test ends.
func create(tb testing.TB, m *Manager, l Limits) *Group {
	tb.Helper()
	g, err := m.Create(testID(), l)
	if err != nil {
		tb.Fatalf("Create: %v", err)
	}
	tb.Cleanup(func() {
		if err := g.Delete(); err != nil {
			tb.Errorf("cleanup Delete: %v", err)
		}
	})
	return g
}

// proc is a child process that is moved into a group before it runs the
// interesting part of its script.
type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan error
}

// startIn starts `sh -c script`, moves the shell into g and only then lets
// the script run (the shell first waits for a line on stdin).
func startIn(t *testing.T, g *Group, script string) *proc {
	t.Helper()
	p := start(t, exec.Command("sh", "-c", "read go; "+script))
	if err := g.AddProc(p.cmd.Process.Pid); err != nil {
		t.Fatalf("AddProc: %v", err)
	}
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		t.Fatalf("release script: %v", err)
	}
	return p
}

func start(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	p := &proc{cmd: cmd, stdin: stdin, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait returns the process's exit error, failing the test after timeout.
func (p *proc) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-time.After(timeout):
		t.Fatalf("%v still running after %v", p.cmd.Args, timeout)
		return nil
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func mustPids(t *testing.T, g *Group) []int {
	t.Helper()
	pids, err := g.Pids()
	if err != nil {
		t.Fatalf("Pids: %v", err)
	}
	return pids
}

// comms returns the command names of pids.
func comms(pids []int) []string {
	var out []string
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		if err == nil {
			out = append(out, strings.TrimSpace(string(b)))
		}
	}
	slices.Sort(out)
	return out
}

// cgroupOf returns /proc/<tid>/cgroup's path for controller ("" for the
// v2 line).
func cgroupOf(t *testing.T, procDir, controller string) string {
	t.Helper()
	for _, line := range strings.Split(readTrim(t, filepath.Join(procDir, "cgroup")), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), controller) {
			return parts[2]
		}
		if len(parts) == 3 && controller == "" && parts[1] == "" {
			return parts[2]
		}
	}
	t.Fatalf("%s/cgroup has no %q line", procDir, controller)
	return ""
}

func assertGone(t *testing.T, g *Group) {
	t.Helper()
	for _, d := range g.dirs {
		if exists(d.path) {
			t.Errorf("%s still exists", d.path)
		}
	}
}
