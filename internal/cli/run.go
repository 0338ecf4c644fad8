package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	hutch "github.com/hutch-dev/hutch/sdk"
)

type runFlags struct {
	data, base, cwd string
	env             []string
	memory          int64
	pids, cpu       int64
	stdin, tty      bool
	net             networkFlags
}

func runCmd(g *globals) *cobra.Command {
	var f runFlags
	c := &cobra.Command{
		Use:   "run [flags] -- CMD...",
		Short: "Run a command in a throwaway sandbox and exit with its code",
		Long: "run creates a sandbox, runs CMD with sh -c, streams its output, destroys the sandbox and exits " +
			"with the command's code (128+N when killed by signal N, 124 on timeout); SIGINT and SIGTERM are " +
			"passed on to the command.\n\n" +
			"run is a client of the daemon at --host ($HUTCH_HOST) or, by default, of the one on the socket in " +
			"the data directory (--data). When no --host is given and no daemon answers on that socket, run " +
			"creates the sandbox itself, in this process, on the native backend (which needs root), so it " +
			"works on a fresh machine with no daemon; a network policy other than deny-all then gets this " +
			"process's own router, egress proxy and resolver for as long as the command runs.",
		Args: minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return g.run(cmd.Context(), f, args) },
	}
	fl := c.Flags()
	fl.StringVar(&f.data, "data", defaultDataDir(), "data directory: its daemon's socket, or the in-process sandbox's home")
	fl.StringVar(&f.base, "base", "host", "root filesystem: host, dir:/path or oci:/path/image.tar[#ref]")
	fl.StringVar(&f.cwd, "cwd", "", "working directory (default /workspace)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.Int64Var(&f.memory, "memory", 0, "memory limit in MiB")
	fl.Int64Var(&f.pids, "pids", 0, "process limit")
	fl.Int64Var(&f.cpu, "cpu", 0, "CPU limit in millicores (1000 = one core)")
	fl.BoolVarP(&f.stdin, "interactive", "i", false, "pass standard input to the command")
	fl.BoolVarP(&f.tty, "tty", "t", false, "run the command on a terminal")
	f.net.register(c)
	return c
}

func (g *globals) run(ctx context.Context, f runFlags, args []string) error {
	env, err := parseKV("env", f.env)
	if err != nil {
		return err
	}
	var pol *hutch.NetworkPolicy
	if f.net.given() {
		p, err := f.net.policy()
		if err != nil {
			return err
		}
		pol = &p
	}
	c, err := g.runClient(ctx, f.data)
	if errors.Is(err, hutch.ErrUnavailable) && g.host == "" {
		return runNative(ctx, f, env, pol, args)
	}
	if err != nil {
		return err
	}
	o := hutch.CreateOptions{ID: newID(), Base: f.base, Cwd: f.cwd, Env: env, Network: pol,
		Limits: hutch.Limits{MemoryMiB: f.memory, CPUMillis: f.cpu, Pids: f.pids}}
	sb, err := createInterruptibly(ctx, c, o)
	defer func() { _ = c.Delete(background(ctx), o.ID) }()
	if err != nil {
		return err
	}
	return g.execIn(ctx, sb, execSpec{cmd: strings.Join(args, " "), stdin: f.stdin || f.tty, tty: f.tty})
}

// createInterruptibly creates the sandbox; a SIGINT, SIGTERM or SIGHUP
// meanwhile cancels that and exits shell style. Signals stay caught until
// run returns, so none kills it before it has destroyed the sandbox.
func createInterruptibly(ctx context.Context, c *hutch.Client, o hutch.CreateOptions) (*hutch.Sandbox, error) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var got atomic.Value
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case s := <-sigs:
			got.Store(s)
			cancel()
		case <-done:
		}
	}()
	sb, err := c.Create(cctx, o)
	if s, ok := got.Load().(syscall.Signal); ok {
		return nil, exitError{128 + int(s)}
	}
	return sb, err
}

// runClient is a client of --host or of the daemon on data's socket; an
// error matching ErrUnavailable says that no daemon answered.
func (g *globals) runClient(ctx context.Context, data string) (*hutch.Client, error) {
	host := g.host
	if host == "" {
		host = "unix://" + filepath.Join(data, "hutch.sock")
	}
	c, err := hutch.New(host, g.apiKey, hutch.WithUserAgent("hutch-cli/"+Version))
	if err != nil {
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = c.Health(hctx)
	return c, err
}

func newID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "run-" + hex.EncodeToString(b)
}
