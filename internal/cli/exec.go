package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	hutch "github.com/hutch-dev/hutch/sdk"
)

// execSpec is a command to run in a sandbox and how.
type execSpec struct {
	cmd        string // "" with tty: the login shell
	cwd        string
	env        map[string]string
	timeout    time.Duration
	stdin, tty bool
}

func (sp execSpec) options() []hutch.ExecOption {
	opts := []hutch.ExecOption{hutch.WithCwd(sp.cwd), hutch.WithEnv(sp.env)}
	if sp.timeout > 0 {
		opts = append(opts, hutch.WithTimeout(sp.timeout))
	}
	return opts
}

type execFlags struct {
	stdin, tty, detach bool
	cwd, tag           string
	env                []string
	timeout            time.Duration
}

func execCmd(g *globals) *cobra.Command {
	var f execFlags
	c := &cobra.Command{
		Use:   "exec [flags] ID [--] CMD...",
		Short: "Run a command in a sandbox and exit with its code",
		Long: "exec runs CMD (its words joined with spaces) with sh -c in the sandbox ID, streams its output " +
			"and exits with its code (128+N when killed by signal N, 124 on timeout). SIGINT and SIGTERM are " +
			"passed on to it. -i streams standard input to it; -t runs it on a terminal (in raw mode when " +
			"standard input is one); -d starts it in the background and prints its process id.",
		Args: minArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			env, err := parseKV("env", f.env)
			if err != nil {
				return err
			}
			words := args[1:]
			if words[0] == "--" {
				words = words[1:]
			}
			if len(words) == 0 {
				return invalid("exec: no command given")
			}
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			sp := execSpec{cmd: strings.Join(words, " "), cwd: f.cwd, env: env, timeout: f.timeout, stdin: f.stdin, tty: f.tty}
			if f.detach {
				return g.startDetached(cmd.Context(), sb, sp, f.tag)
			}
			return g.execIn(cmd.Context(), sb, sp)
		},
	}
	c.Flags().SetInterspersed(false) // everything after ID is the command
	fl := c.Flags()
	fl.BoolVarP(&f.stdin, "interactive", "i", false, "pass standard input to the command")
	fl.BoolVarP(&f.tty, "tty", "t", false, "run the command on a terminal")
	fl.BoolVarP(&f.detach, "detach", "d", false, "start the command in the background; print its process id")
	fl.StringVar(&f.tag, "tag", "", "with -d: tag the process, to name it in logs, kill and ps")
	fl.StringVar(&f.cwd, "cwd", "", "working directory (default: the sandbox's)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.DurationVar(&f.timeout, "timeout", 0, "kill the command after this long, e.g. 10s (default 300s)")
	return c
}

func shellCmd(g *globals) *cobra.Command {
	var cwd string
	var env []string
	c := &cobra.Command{
		Use:   "shell ID",
		Short: "Open a login shell in a sandbox (exec -it with the sandbox's shell)",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := parseKV("env", env)
			if err != nil {
				return err
			}
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			return g.execIn(cmd.Context(), sb, execSpec{cwd: cwd, env: e, stdin: true, tty: true})
		},
	}
	c.Flags().StringVar(&cwd, "cwd", "", "working directory (default: the sandbox's)")
	c.Flags().StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	return c
}

// execIn runs sp in sb, the way its flags ask, and returns the command's
// exit code as an exitError.
func (g *globals) execIn(ctx context.Context, sb *hutch.Sandbox, sp execSpec) error {
	var st *hutch.ExitStatus
	var err error
	switch {
	case sp.tty:
		st, err = g.runTerminal(ctx, sb, sp)
	case sp.stdin:
		st, err = g.runInteractive(ctx, sb, sp)
	default:
		st, err = g.runStream(ctx, sb, sp)
	}
	if err != nil {
		return err
	}
	if st == nil {
		return fmt.Errorf("%s: the command's exit status is unknown", sb.ID)
	}
	if code := st.Code(); code != 0 {
		return exitError{code}
	}
	return nil
}

// runStream streams the command's output (NDJSON events with -o json).
func (g *globals) runStream(ctx context.Context, sb *hutch.Sandbox, sp execSpec) (*hutch.ExitStatus, error) {
	var pid atomic.Value
	stop := relaySignals(func(sig string) {
		if id, ok := pid.Load().(string); ok {
			_ = sb.Signal(background(ctx), id, sig)
		}
	})
	defer stop()
	h := hutch.StreamHandler{Stdout: g.out, Stderr: g.errOut}
	enc := json.NewEncoder(g.out)
	h.OnEvent = func(ev hutch.Event) error {
		if ev.Type == hutch.EventStart {
			pid.Store(ev.ProcessID)
		}
		if g.json() {
			return enc.Encode(ev)
		}
		return nil
	}
	if g.json() {
		h.Stdout, h.Stderr = nil, nil
	}
	return sb.ExecStream(ctx, sp.cmd, h, sp.options()...)
}

// runInteractive runs the command over a WebSocket with stdin.
func (g *globals) runInteractive(ctx context.Context, sb *hutch.Sandbox, sp execSpec) (*hutch.ExitStatus, error) {
	s, err := sb.ExecInteractive(ctx, sp.cmd, sp.options()...)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	stop := relaySignals(func(sig string) { _ = s.Signal(sig) })
	defer stop()
	go func() {
		_, _ = io.Copy(s, os.Stdin)
		_ = s.CloseStdin()
	}()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(g.out, s.Stdout()) })
	wg.Go(func() { _, _ = io.Copy(g.errOut, s.Stderr()) })
	st, err := s.Wait()
	wg.Wait()
	return st, err
}

// startDetached starts the command as a background process.
func (g *globals) startDetached(ctx context.Context, sb *hutch.Sandbox, sp execSpec, tag string) error {
	p, err := sb.StartProcess(ctx, sp.cmd, hutch.ProcessOptions{Cwd: sp.cwd, Env: sp.env, Tag: tag,
		Stdin: sp.stdin, TTY: sp.tty, Timeout: sp.timeout})
	if err != nil {
		return err
	}
	return g.print(p, func(w io.Writer) { fmt.Fprintln(w, p.ID) })
}

// relaySignals passes SIGINT, SIGTERM and SIGHUP to send until stopped.
func relaySignals(send func(sig string)) (stop func()) {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-ch:
				send(unix.SignalName(s.(syscall.Signal)))
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}
