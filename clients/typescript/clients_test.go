package typescript

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	hutch "github.com/hutch-dev/hutch/sdk"
)

// TestTypeScript installs the package's locked dependencies, checks that
// the generated API types match api/openapi.yaml, compiles with tsc (which
// type-checks the eve adapter against eve's own types), builds the hutch
// binary, starts `hutch serve` with a TCP listener and an API key, and runs
// the node test suite against it.
func TestTypeScript(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the suite runs a real daemon on the native backend, which needs root")
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the TypeScript suite needs %s (Node 20+) on PATH: %v", tool, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	run(t, ctx, nil, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	if out, err := command(ctx, nil, "npm", "run", "-s", "check-generated").CombinedOutput(); err != nil {
		t.Fatalf("src/generated/api.ts is stale against api/openapi.yaml; run `npm run generate` in clients/typescript:\n%s", out)
	}
	run(t, ctx, nil, "npm", "run", "-s", "build")

	bin := filepath.Join(t.TempDir(), "hutch")
	build := command(ctx, []string{"CGO_ENABLED=0"}, "go", "build", "-o", bin, "github.com/hutch-dev/hutch/cmd/hutch")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build hutch: %v\n%s", err, out)
	}
	d := startDaemon(t, bin)
	secret := createKey(t, ctx, bin, d.socket)

	env := []string{"HUTCH_TCP=http://" + d.tcp, "HUTCH_API_KEY=" + secret, "HUTCH_SOCKET=" + d.socket, "HUTCH_HOST=",
		"HUTCH_EXEC_TIMEOUT=" + execTimeout}
	tctx, tcancel := context.WithTimeout(ctx, 3*time.Minute)
	defer tcancel()
	files, err := filepath.Glob("dist/test/*.test.js")
	if err != nil || len(files) == 0 {
		t.Fatalf("no compiled test files in dist/test (%v)", err)
	}
	args := append([]string{"--test", "--test-concurrency=1", "--test-reporter=spec"}, files...)
	out, err := command(tctx, env, "node", args...).CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatalf("the TypeScript suite failed: %v", err)
	}
	if left := d.live(t); len(left) > 0 {
		t.Errorf("the suite left live sandboxes behind: %v", left)
	}
}

func command(ctx context.Context, env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

func run(t *testing.T, ctx context.Context, env []string, name string, args ...string) {
	t.Helper()
	if out, err := command(ctx, env, name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

type daemon struct{ data, socket, tcp string }

// execTimeout is the daemon's default exec deadline in the suite (HUTCH_EXEC_TIMEOUT to the tests).
const execTimeout = "2s"

// startDaemon runs `hutch serve` on a fresh data directory until the test
// ends; then it destroys whatever sandboxes are left and stops it.
func startDaemon(t *testing.T, bin string) *daemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "hutch-ts-")
	if err != nil {
		t.Fatal(err)
	}
	// A sandbox's root is an unprivileged host uid: it must traverse the data directory.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	d := &daemon{data: dir, socket: filepath.Join(dir, "hutch.sock")}
	// A short default exec deadline shows that the adapters' commands without
	// a timeout are not cut at it (they run as processes, which have none).
	cmd := exec.Command(bin, "serve", "--data", dir, "--listen", "127.0.0.1:0", "--log-level", "info", "--exec-timeout", execTimeout)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(t, cmd) })
	if d.tcp, err = servingAddr(stderr); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
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

// createKey makes an API key over the socket, as an operator would.
func createKey(t *testing.T, ctx context.Context, bin, socket string) string {
	t.Helper()
	out, err := command(ctx, nil, bin, "--host", "unix://"+socket, "-o", "json", "keys", "create", "ts-suite").Output()
	if err != nil {
		t.Fatalf("hutch keys create: %v", err)
	}
	var k struct{ Secret string }
	if err := json.Unmarshal(out, &k); err != nil || k.Secret == "" {
		t.Fatalf("hutch keys create printed %q: %v", out, err)
	}
	return k.Secret
}

var liveStates = []hutch.State{hutch.StateRunning, hutch.StatePaused, hutch.StateSuspended, hutch.StateRetired, hutch.StateFailed}

// live lists the sandboxes of every tenant that are not destroyed.
func (d *daemon) live(t *testing.T) []string {
	c, err := hutch.New("unix://"+d.socket, "")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for sb, err := range c.All(context.Background(), hutch.ListOptions{States: liveStates}) {
		if err != nil {
			t.Errorf("list sandboxes: %v", err)
			break
		}
		ids = append(ids, sb.ID+" ("+string(sb.State)+")")
	}
	return ids
}

func (d *daemon) stop(t *testing.T, cmd *exec.Cmd) {
	ctx := context.Background()
	if c, err := hutch.New("unix://"+d.socket, ""); err == nil {
		for sb, err := range c.All(ctx, hutch.ListOptions{States: liveStates}) {
			if err != nil {
				break
			}
			if err := c.Delete(ctx, sb.ID); err != nil {
				t.Log("cleanup: ", err)
			}
		}
	}
	_ = cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Log("daemon: ", err)
	}
	_ = os.RemoveAll(d.data)
}
