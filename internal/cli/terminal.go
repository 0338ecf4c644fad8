package cli

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	hutch "github.com/hutch-dev/hutch/sdk"
)

// runTerminal runs the command (or, with none, the login shell) on a
// terminal in the sandbox and attaches to it: raw mode when stdin is a
// terminal, window size changes passed on.
func (g *globals) runTerminal(ctx context.Context, sb *hutch.Sandbox, sp execSpec) (*hutch.ExitStatus, error) {
	rows, cols := windowSize()
	var p *hutch.Process
	var err error
	if sp.cmd == "" {
		p, err = sb.OpenTerminal(ctx, hutch.TerminalOptions{Cwd: sp.cwd, Env: sp.env, Rows: rows, Cols: cols})
	} else {
		p, err = sb.StartProcess(ctx, sp.cmd, hutch.ProcessOptions{Cwd: sp.cwd, Env: sp.env, TTY: true,
			Stdin: true, Rows: rows, Cols: cols, Timeout: sp.timeout})
	}
	if err != nil {
		return nil, err
	}
	t, err := sb.AttachTerminal(ctx, p.ID, -1)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	fd := int(os.Stdin.Fd())
	if sp.stdin && term.IsTerminal(fd) {
		if old, err := term.MakeRaw(fd); err == nil {
			defer term.Restore(fd, old)
		}
	}
	stopResize := relayResize(t)
	defer stopResize()
	stopSignals := relaySignals(func(sig string) { _ = sb.Signal(background(ctx), p.ID, sig) })
	defer stopSignals()
	if sp.stdin {
		go func() { _, _ = io.Copy(t, os.Stdin) }()
	}
	if _, err := io.Copy(g.out, t); err != nil {
		return nil, err
	}
	if st := t.Exit(); st != nil {
		return st, nil
	}
	done, err := sb.Wait(ctx, p.ID, 0) // the daemon hung up first
	if err != nil {
		return nil, err
	}
	return done.Exit, nil
}

// windowSize is the local terminal's size, or 24x80.
func windowSize() (rows, cols int) {
	for _, f := range []*os.File{os.Stdout, os.Stdin} {
		if c, r, err := term.GetSize(int(f.Fd())); err == nil && r > 0 && c > 0 {
			return r, c
		}
	}
	return 24, 80
}

// relayResize passes window size changes on to t.
func relayResize(t *hutch.Terminal) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				rows, cols := windowSize()
				_ = t.Resize(rows, cols)
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}
