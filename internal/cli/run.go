package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

type runFlags struct {
	data, base, cwd string
	env             []string
	memory          int64
	pids, cpu       int64
	stdin, tty      bool
}

func runCmd() *cobra.Command {
	var f runFlags
	c := &cobra.Command{
		Use:   "run [flags] -- CMD...",
		Short: "Run a command in a throwaway sandbox and exit with its code",
		Long: "run creates a sandbox on the native backend in this process (it needs root), " +
			"runs CMD with sh -c, streams its output, destroys the sandbox and exits with the command's code " +
			"(128+N when killed by signal N, 124 on timeout).",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runInSandbox(cmd.Context(), f, args) },
	}
	fl := c.Flags()
	fl.StringVar(&f.data, "data", defaultDataDir(), "data directory")
	fl.StringVar(&f.base, "base", "host", "root filesystem: host, dir:/path or oci:/path/image.tar[#ref]")
	fl.StringVar(&f.cwd, "cwd", "", "working directory (default /workspace)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.Int64Var(&f.memory, "memory", 0, "memory limit in MiB")
	fl.Int64Var(&f.pids, "pids", 0, "process limit")
	fl.Int64Var(&f.cpu, "cpu", 0, "CPU limit in millicores (1000 = one core)")
	fl.BoolVarP(&f.stdin, "interactive", "i", false, "pass standard input to the command")
	fl.BoolVarP(&f.tty, "tty", "t", false, "run the command on a terminal")
	return c
}

func defaultDataDir() string {
	if d := os.Getenv("HUTCH_DATA"); d != "" {
		return d
	}
	return ".hutch"
}

func parseEnv(kvs []string) (map[string]string, error) {
	env := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--env %q: want KEY=VALUE: %w", kv, errdefs.ErrInvalidArgument)
		}
		env[k] = v
	}
	return env, nil
}

func newID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "run-" + hex.EncodeToString(b)
}

func runInSandbox(ctx context.Context, f runFlags, args []string) error {
	env, err := parseEnv(f.env)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(f.data, 0o711); err != nil {
		return err
	}
	b, err := native.New(native.Options{DataDir: f.data})
	if err != nil {
		return err
	}
	id := newID()
	spec := backend.Spec{ID: id, Base: f.base, Env: env, Cwd: f.cwd,
		Limits: backend.Limits{MemoryBytes: f.memory << 20, Pids: f.pids, CPUMillis: f.cpu}}
	if _, err := b.Create(ctx, spec); err != nil {
		return err
	}
	defer b.Destroy(context.WithoutCancel(ctx), id)
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
