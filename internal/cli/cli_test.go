package cli_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/cli"
	"github.com/hutch-dev/hutch/internal/netpolicy/gateway"
	hutch "github.com/hutch-dev/hutch/sdk"
)

// TestMain makes this test binary the hutch command of the scripts (and,
// re-executed by the native backend, every sandbox's init).
func TestMain(m *testing.M) {
	if native.IsInit() {
		native.InitMain()
	}
	testscript.Main(m, map[string]func(){
		"hutch": func() { os.Exit(cli.Main(os.Args[1:])) },
	})
}

// TestScripts runs testdata/script/*.txtar, each against a daemon of its
// own: $HUTCH_HOST is its socket, $HUTCH_TCP its TCP address and
// $HUTCH_DAEMON_DATA its data directory. $HUTCH_DATA points where no
// daemon is.
func TestScripts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the scripts need root: they run a real daemon on the native backend")
	}
	networked := hostNetworked(t)
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		Setup:               setup,
		// [hutchnet]: the daemons' default --network auto comes up with
		// networking on this host (netns, nftables).
		Condition: func(cond string) (bool, error) {
			if cond == "hutchnet" {
				return networked, nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
		Cmds: map[string]func(*testscript.TestScript, bool, []string){
			"waitsock": waitSock,
			"capture":  capture,
			"exitcode": exitCode,
		},
	})
}

func setup(env *testscript.Env) error {
	// The work directory must be traversable: sandbox roots are other uids.
	for d := env.WorkDir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			return err
		}
	}
	d, err := startDaemon(env)
	if err != nil {
		return err
	}
	env.Setenv("HUTCH_HOST", "unix://"+d.socket)
	env.Setenv("HUTCH_TCP", "http://"+d.tcp)
	env.Setenv("HUTCH_DAEMON_DATA", d.data)
	env.Setenv("HUTCH_API_KEY", "")
	env.Setenv("HUTCH_DATA", filepath.Join(env.WorkDir, "no-daemon"))
	return nil
}

type testDaemon struct{ data, socket, tcp string }

// startDaemon runs `hutch serve` (this binary) in a process of its own, on
// a fresh data directory, until the script ends; then it destroys what the
// script left and stops it. (An in-process daemon would share the test
// binary's umask with every other script's commands.)
func startDaemon(env *testscript.Env) (*testDaemon, error) {
	dir, err := os.MkdirTemp("", "hutch-cli-test-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	d := &testDaemon{data: dir, socket: filepath.Join(dir, "hutch.sock")}
	cmd := exec.Command("hutch", "serve", "--data", dir, "--listen", "127.0.0.1:0", "--log-level", "info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	env.Defer(func() { d.stop(env, cmd) })
	if d.tcp, err = servingAddr(stderr); err != nil {
		return nil, err
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	return d, nil
}

// servingAddr reads the daemon's log up to its "hutch serving" line and
// returns the TCP address it names.
func servingAddr(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	var log []string
	for sc.Scan() {
		log = append(log, sc.Text())
		if m := regexp.MustCompile(`msg="hutch serving".* tcp=(\S+)`).FindStringSubmatch(sc.Text()); m != nil {
			return m[1], nil
		}
	}
	return "", fmt.Errorf("the daemon did not start:\n%s", strings.Join(log, "\n"))
}

func (d *testDaemon) stop(env *testscript.Env, cmd *exec.Cmd) {
	if c, err := hutch.New("unix://"+d.socket, ""); err == nil {
		ctx := context.Background()
		for sb, err := range c.All(ctx, hutch.ListOptions{States: []hutch.State{hutch.StateRunning, hutch.StateFailed,
			hutch.StatePaused, hutch.StateSuspended, hutch.StateRetired}}) {
			if err != nil {
				break
			}
			if err := c.Delete(ctx, sb.ID); err != nil {
				env.T().Log("cleanup: ", err)
			}
		}
	}
	_ = cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		env.T().Log("daemon: ", err)
	}
	_ = os.RemoveAll(d.data)
}

// waitsock PATH waits (up to 30s) until a daemon answers on the unix
// socket PATH.
func waitSock(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 || neg {
		ts.Fatalf("usage: waitsock PATH")
	}
	path := ts.MkAbs(args[0])
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	ts.Fatalf("no daemon on %s", path)
}

// capture NAME stdout|stderr [REGEXP] sets $NAME to the last command's
// output, trimmed, or to the first group REGEXP matches in it.
func capture(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 2 || len(args) > 3 || neg || (args[1] != "stdout" && args[1] != "stderr") {
		ts.Fatalf("usage: capture NAME stdout|stderr [REGEXP]")
	}
	out := strings.TrimSpace(ts.ReadFile(args[1]))
	if len(args) == 3 {
		m := regexp.MustCompile(args[2]).FindStringSubmatch(out)
		if len(m) < 2 {
			ts.Fatalf("no match for %q in %s", args[2], args[1])
		}
		out = m[1]
	}
	ts.Setenv(args[0], out)
}

// exitcode N PROG ARGS... runs PROG and wants its exit code to be N.
func exitCode(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 2 || neg {
		ts.Fatalf("usage: exitcode N PROG [ARGS...]")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		got = ee.ExitCode()
	} else {
		ts.Check(err)
	}
	if got != want {
		ts.Fatalf("%s exited with %d, want %d", args[1], got, want)
	}
}

// hostNetworked reports whether sandbox networking can be set up here, as
// `hutch serve --network auto` would find.
func hostNetworked(t *testing.T) bool {
	g, err := gateway.New(gateway.Options{DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Logf("sandbox networking is not available here, network scripts skip: %v", err)
		return false
	}
	_ = g.Close()
	return true
}
