package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/netpolicy"
	"github.com/hutch-dev/hutch/internal/netpolicy/gateway"
	hutch "github.com/hutch-dev/hutch/sdk"
)

func defaultDataDir() string {
	if d := os.Getenv("HUTCH_DATA"); d != "" {
		return d
	}
	return ".hutch"
}

// runNative is run without a daemon: the sandbox lives in this process's
// native backend, for as long as the command runs.
func runNative(ctx context.Context, f runFlags, env map[string]string, netPol *hutch.NetworkPolicy, args []string) error {
	if err := os.MkdirAll(f.data, 0o711); err != nil {
		return err
	}
	pol, err := compilePolicy(netPol)
	if err != nil {
		return err
	}
	opts := native.Options{DataDir: f.data, WarmInits: -1} // one sandbox: no pool
	var gw *gateway.Gateway
	if pol.Networked() {
		if gw, err = gateway.New(gateway.Options{DataDir: f.data, Logger: slog.New(slog.DiscardHandler)}); err != nil {
			return fmt.Errorf("sandbox networking: %w", err)
		}
		defer gw.Close()
		opts.Nameserver, opts.CA = gw.Nameserver().String(), gw.CAPEM()
	}
	b, err := native.New(opts)
	if err != nil {
		return err
	}
	defer b.Close()
	id := newID()
	spec := backend.Spec{ID: id, Base: f.base, Env: env, Cwd: f.cwd,
		Limits: backend.Limits{MemoryBytes: f.memory << 20, Pids: f.pids, CPUMillis: f.cpu}}
	if _, err := b.Create(ctx, spec); err != nil {
		return err
	}
	defer b.Destroy(context.WithoutCancel(ctx), id)
	if gw != nil {
		info, err := b.Inspect(ctx, id)
		if err == nil {
			err = gw.Apply(ctx, id, info.Pid, pol)
		}
		if err != nil {
			return err
		}
		defer gw.Release(id)
	}
	req := backend.ExecRequest{Cmd: strings.Join(args, " "), Stdin: f.stdin || f.tty, TTY: f.tty}
	if f.tty {
		if ws, err := unix.IoctlGetWinsize(int(os.Stdin.Fd()), unix.TIOCGWINSZ); err == nil {
			req.Rows, req.Cols = ws.Row, ws.Col
		}
	}
	p, err := b.Exec(ctx, id, req)
	if err != nil {
		return err
	}
	defer p.Close()
	stopSignals := forwardSignals(ctx, p)
	defer stopSignals()
	if req.Stdin {
		go pumpStdin(p)
	}
	st, err := backend.Wait(p, os.Stdout, os.Stderr)
	if err != nil {
		return err
	}
	return exitFor(st)
}

func pumpStdin(p backend.Process) {
	_, _ = io.Copy(p, os.Stdin)
	_ = p.CloseStdin()
}

// forwardSignals passes SIGINT and SIGTERM on to the command.
func forwardSignals(ctx context.Context, p backend.Process) func() {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-ch:
				_ = p.Signal(ctx, s.(syscall.Signal))
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}

// exitFor turns a command's status into hutch's exit code, shell style.
func exitFor(st backend.ExitStatus) error {
	switch {
	case st.TimedOut:
		return exitError{124}
	case st.Signal != "":
		return exitError{128 + int(unix.SignalNum(st.Signal))}
	case st.Code != 0:
		return exitError{st.Code}
	}
	return nil
}

// compilePolicy checks the SDK's form of a policy as the daemon would.
func compilePolicy(p *hutch.NetworkPolicy) (*netpolicy.Compiled, error) {
	if p == nil {
		return netpolicy.DenyAllPolicy(), nil
	}
	raw, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	var np netpolicy.Policy
	if err := json.Unmarshal(raw, &np); err != nil {
		return nil, err
	}
	return netpolicy.Compile(np)
}
