package e2b_test

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
)

// TestE2BSDK runs the e2b SDK's own client, unchanged, against a real
// `hutch serve`: npm ci in testdata/sdk, build the hutch binary, start it
// with a TCP listener, make an API key over its socket, and run the node
// test file with the variables a user sets (E2B_API_URL, E2B_SANDBOX_URL,
// E2B_API_KEY).
func TestE2BSDK(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the suite runs a real daemon on the native backend, which needs root")
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the e2b SDK suite needs %s (Node 20+) on PATH: %v", tool, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir, err := filepath.Abs("testdata/sdk")
	if err != nil {
		t.Fatal(err)
	}
	npm := command(ctx, dir, nil, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	if out, err := npm.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}
	bin := filepath.Join(t.TempDir(), "hutch")
	if out, err := command(ctx, "", []string{"CGO_ENABLED=0"}, "go", "build", "-o", bin, "github.com/hutch-dev/hutch/cmd/hutch").CombinedOutput(); err != nil {
		t.Fatalf("build hutch: %v\n%s", err, out)
	}
	d := startServe(t, bin)
	out, err := command(ctx, "", nil, bin, "--host", "unix://"+d.socket, "-o", "json", "keys", "create", "e2b-suite").Output()
	if err != nil {
		t.Fatalf("hutch keys create: %v", err)
	}
	var key struct{ Secret string }
	if err := json.Unmarshal(out, &key); err != nil || key.Secret == "" {
		t.Fatalf("hutch keys create printed %q: %v", out, err)
	}
	url := "http://" + d.tcp
	env := []string{"E2B_API_URL=" + url, "E2B_SANDBOX_URL=" + url, "E2B_API_KEY=" + key.Secret, "E2B_DOMAIN=", "E2B_DEBUG="}
	tctx, tcancel := context.WithTimeout(ctx, 150*time.Second)
	defer tcancel()
	out, err = command(tctx, dir, env, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", "e2b.test.mjs").CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatalf("the e2b SDK suite failed: %v", err)
	}
}

func command(ctx context.Context, dir string, env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

type served struct{ data, socket, tcp string }

// startServe runs `hutch serve` on a fresh data directory until the test
// ends, then destroys what is left and stops it.
func startServe(t *testing.T, bin string) *served {
	t.Helper()
	dir, err := os.MkdirTemp("", "hutch-e2b-")
	if err != nil {
		t.Fatal(err)
	}
	// A sandbox's root is an unprivileged host uid: it must traverse the data directory.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	d := &served{data: dir, socket: filepath.Join(dir, "hutch.sock")}
	cmd := exec.Command(bin, "serve", "--data", dir, "--listen", "127.0.0.1:0", "--log-level", "info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Whatever the suite left, as the operator would clean it.
		out, _ := exec.Command(bin, "--host", "unix://"+d.socket, "ls", "-o", "json").Output()
		var left []struct{ ID string }
		_ = json.Unmarshal(out, &left)
		for _, sb := range left {
			_ = exec.Command(bin, "--host", "unix://"+d.socket, "rm", "-f", sb.ID).Run()
		}
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		_ = os.RemoveAll(dir)
	})
	sc := bufio.NewScanner(stderr)
	re := regexp.MustCompile(`msg="hutch serving".* tcp=(\S+)`)
	var log []string
	for sc.Scan() {
		log = append(log, sc.Text())
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			d.tcp = m[1]
			break
		}
	}
	if d.tcp == "" {
		t.Fatal(fmt.Errorf("the daemon did not start:\n%s", strings.Join(log, "\n")))
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	return d
}
