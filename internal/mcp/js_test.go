package mcp_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	hutch "github.com/hutch-dev/hutch/sdk"
)

// TestTypeScriptClient runs testdata/js/mcp.test.mjs: the official
// TypeScript MCP client (@modelcontextprotocol/sdk from npm) against a real
// `hutch serve`, over stdio (it spawns `hutch mcp`) and streamable HTTP
// with two tenants' API keys.
func TestTypeScriptClient(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a real daemon needs root (the native backend maps uid ranges and makes idmapped mounts)")
	}
	node, errNode := exec.LookPath("node")
	npm, errNpm := exec.LookPath("npm")
	if errNode != nil || errNpm != nil {
		t.Skip("the TypeScript client test needs node (20+) and npm on PATH")
	}
	t.Parallel()
	dir, err := filepath.Abs("testdata/js")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	run(t, ctx, dir, nil, npm, "ci", "--no-audit", "--no-fund")
	bin := hutchBinary(t)
	sock, addr := serve(t, bin)

	c, err := hutch.New("unix://"+sock, "")
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"HUTCH_BIN=" + bin, "HUTCH_SOCKET=" + sock, "HUTCH_MCP_URL=http://" + addr + "/mcp"}
	for _, tenant := range []string{"A", "B"} {
		k, err := c.CreateKey(ctx, "ts-"+tenant, hutch.KeyOptions{Tenant: "ts-" + tenant})
		if err != nil {
			t.Fatal(err)
		}
		env = append(env, "HUTCH_KEY_"+tenant+"="+k.Secret)
	}
	t.Cleanup(func() {
		// A failed run may leave sandboxes; the daemon would leave them
		// running when it stops.
		for sb, err := range c.All(context.Background(), hutch.ListOptions{}) {
			if err == nil {
				_ = sb.Delete(context.Background())
			}
		}
	})
	run(t, ctx, dir, env, node, "--test", "--test-reporter=spec", "mcp.test.mjs")
}

// run runs a command in dir and fails the test with its output if it fails.
func run(t *testing.T, ctx context.Context, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("%s %v:\n%s", filepath.Base(name), args, out.String())
	if err != nil {
		t.Fatalf("%s %v: %v", filepath.Base(name), args, err)
	}
}

// serve starts `hutch serve` on a fresh data directory with a TCP listener
// and returns its socket and TCP address once it answers; the daemon is
// stopped (SIGTERM) when the test ends.
func serve(t *testing.T, bin string) (sock, addr string) {
	t.Helper()
	data := t.TempDir()
	for d := data; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil { // sandboxes' uids must traverse to their roots
			t.Fatal(err)
		}
	}
	addr = freePort(t)
	var log bytes.Buffer
	cmd := exec.Command(bin, "serve", "--data", data, "--listen", addr, "--grace", "2s")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	sock = filepath.Join(data, "hutch.sock")
	c, err := hutch.New("unix://"+sock, "")
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("hutch serve exited while starting (%v):\n%s", err, log.String())
		default:
		}
		if _, err := c.Health(context.Background()); err == nil {
			return sock, addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("hutch serve did not answer within 30s")
		}
	}
}

// freePort returns a loopback address nobody listens on right now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
