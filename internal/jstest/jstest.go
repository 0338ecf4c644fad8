// Package jstest is what the Go tests that run JavaScript suites share:
// they run real clients (the e2b SDK, the MCP TypeScript client, hutch's
// own TypeScript package) with node's test runner against a real `hutch
// serve` built from this tree, so that the README's one test command runs
// them too. It skips where root, node or npm is missing.
package jstest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	hutch "github.com/hutch-dev/hutch/sdk"
)

// Need skips t unless it runs as root with node and npm on PATH; suite
// names it in the message.
func Need(t testing.TB, suite string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("%s runs a real daemon on the native backend, which needs root", suite)
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s needs %s (Node 20+) on PATH: %v", suite, tool, err)
		}
	}
}

// Command is name args in dir, with env added to this process's.
func Command(ctx context.Context, dir string, env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Run runs a command, logs its output, and fails t if it fails.
func Run(t testing.TB, ctx context.Context, dir string, env []string, name string, args ...string) []byte {
	t.Helper()
	out, err := Command(ctx, dir, env, name, args...).CombinedOutput()
	t.Logf("%s %s:\n%s", filepath.Base(name), strings.Join(args, " "), out)
	if err != nil {
		t.Fatalf("%s %s: %v", filepath.Base(name), strings.Join(args, " "), err)
	}
	return out
}

// NPMCI installs dir's locked dependencies.
func NPMCI(t testing.TB, ctx context.Context, dir string) {
	t.Helper()
	Run(t, ctx, dir, nil, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
}

// Hutch builds the hutch binary from this tree into the test's temp dir.
func Hutch(t testing.TB, ctx context.Context) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "hutch")
	cmd := Command(ctx, "", []string{"CGO_ENABLED=0"}, "go", "build", "-o", bin, "github.com/hutch-dev/hutch/cmd/hutch")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build hutch: %v\n%s", err, out)
	}
	return bin
}

// Daemon is a running `hutch serve`.
type Daemon struct {
	Bin    string
	Data   string
	Socket string
	TCP    string        // host:port of its TCP listener
	Client *hutch.Client // trusted, over the socket
}

// LiveStates are the states of sandboxes not destroyed.
var LiveStates = []hutch.State{hutch.StateRunning, hutch.StatePaused, hutch.StateSuspended, hutch.StateRetired, hutch.StateFailed}

// Serve runs `hutch serve` (with args added) on a fresh data directory
// with a TCP listener until the test ends; then it destroys what sandboxes
// are left, as an operator would, and stops it.
func Serve(t testing.TB, bin string, args ...string) *Daemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "hutch-js-")
	if err != nil {
		t.Fatal(err)
	}
	// A sandbox's root is an unprivileged host uid: it must traverse the
	// data directory (and /tmp is o+x).
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{Bin: bin, Data: dir, Socket: filepath.Join(dir, "hutch.sock")}
	cmd := exec.Command(bin, append([]string{"serve", "--data", dir, "--listen", "127.0.0.1:0", "--log-level", "info",
		"--grace", "2s"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(t, cmd) })
	if d.TCP, err = servingAddr(stderr); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	if d.Client, err = hutch.New("unix://"+d.Socket, ""); err != nil {
		t.Fatal(err)
	}
	return d
}

// servingAddr reads the daemon's log up to its "hutch serving" line and
// returns the TCP address it names.
func servingAddr(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	re := regexp.MustCompile(`msg="hutch serving".* tcp=(\S+)`)
	var log []string
	for sc.Scan() {
		log = append(log, sc.Text())
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			return m[1], nil
		}
	}
	return "", fmt.Errorf("the daemon did not start:\n%s", strings.Join(log, "\n"))
}

// Key makes an API key for tenant ("" = one of its own) over the socket.
func (d *Daemon) Key(t testing.TB, ctx context.Context, name, tenant string) string {
	t.Helper()
	k, err := d.Client.CreateKey(ctx, name, hutch.KeyOptions{Tenant: tenant})
	if err != nil {
		t.Fatalf("create key %s: %v", name, err)
	}
	return k.Secret
}

// Live lists the sandboxes of every tenant that are not destroyed.
func (d *Daemon) Live(t testing.TB) []string {
	t.Helper()
	var ids []string
	for sb, err := range d.Client.All(context.Background(), hutch.ListOptions{States: LiveStates}) {
		if err != nil {
			t.Errorf("list sandboxes: %v", err)
			break
		}
		ids = append(ids, sb.ID+" ("+string(sb.State)+")")
	}
	return ids
}

func (d *Daemon) stop(t testing.TB, cmd *exec.Cmd) {
	ctx := context.Background()
	if d.Client != nil {
		for sb, err := range d.Client.All(ctx, hutch.ListOptions{States: LiveStates}) {
			if err != nil {
				break
			}
			if err := d.Client.Delete(ctx, sb.ID); err != nil {
				t.Log("cleanup: ", err)
			}
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Log("daemon: ", err)
		}
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
	_ = os.RemoveAll(d.Data)
}

// Node runs node's test runner on files in dir with env, one file at a
// time, and fails t (with the report) if a test fails.
func Node(t testing.TB, ctx context.Context, dir string, env []string, files ...string) {
	t.Helper()
	args := append([]string{"--test", "--test-concurrency=1", "--test-reporter=spec"}, files...)
	var out bytes.Buffer
	cmd := Command(ctx, dir, env, "node", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("node --test:\n%s", out.String())
	if err != nil {
		t.Fatalf("the node suite failed: %v", err)
	}
}
