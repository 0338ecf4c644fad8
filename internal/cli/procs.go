package cli

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	hutch "github.com/hutch-dev/hutch/sdk"
)

func psCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ps ID",
		Short: "List a sandbox's processes (running and recently finished)",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			ps, err := sb.Processes(cmd.Context())
			if err != nil {
				return err
			}
			return g.print(ps, func(w io.Writer) { processTable(w, ps) })
		},
	}
}

func processTable(w io.Writer, ps []hutch.Process) {
	fmt.Fprintln(w, "ID\tPID\tTAG\tTTY\tSTATUS\tSTARTED\tCMD")
	for _, p := range ps {
		tty := ""
		if p.TTY {
			tty = "yes"
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", p.ID, p.PID, p.Tag, tty, status(p), ago(p.StartedAt), p.Cmd)
	}
}

// status describes how a process stands: running, exited 3, killed
// SIGTERM, timed out.
func status(p hutch.Process) string {
	switch x := p.Exit; {
	case x == nil:
		return "running"
	case x.TimedOut:
		return "timed out"
	case x.ExitCode != nil:
		return fmt.Sprintf("exited %d", *x.ExitCode)
	default:
		return "killed " + x.Signal
	}
}

func logsCmd(g *globals) *cobra.Command {
	var follow bool
	var from int64
	c := &cobra.Command{
		Use:   "logs [-f] [--from SEQ] ID PROC",
		Short: "Print a process's output (PROC: its id or tag)",
		Long: "logs prints the output a process kept, from chunk number --from on; with -f it goes on " +
			"until the process exits. With -o json it prints the stream's events, one per line.",
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			h := hutch.StreamHandler{Stdout: g.out, Stderr: g.errOut}
			if g.json() {
				enc := json.NewEncoder(g.out)
				h = hutch.StreamHandler{OnEvent: func(ev hutch.Event) error { return enc.Encode(ev) }}
			}
			_, err = sb.ProcessOutput(cmd.Context(), args[1], from, follow, h)
			return err
		},
	}
	c.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output until the process exits")
	c.Flags().Int64Var(&from, "from", 0, "start at this output sequence number")
	return c
}

func killCmd(g *globals) *cobra.Command {
	var sig string
	c := &cobra.Command{
		Use:   "kill [-s SIGNAL] ID PROC",
		Short: "Send a signal to a process's group (PROC: its id or tag)",
		Args:  exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			return sb.Signal(cmd.Context(), args[1], sig)
		},
	}
	c.Flags().StringVarP(&sig, "signal", "s", "TERM", "signal name or number: TERM, SIGKILL, 9")
	return c
}
