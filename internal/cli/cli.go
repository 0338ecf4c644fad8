// Package cli is hutch's command line: every verb of the hutch binary. It
// is kept apart from cmd/hutch so main stays thin and the commands can be
// tested as a user types them.
//
// The client verbs (create, ls, exec, cp, …) talk to a daemon through the
// Go SDK (package sdk); serve runs the daemon; run works either way.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/hutch-dev/hutch/internal/errdefs"
	hutch "github.com/hutch-dev/hutch/sdk"
)

// exitError carries a process exit code through cobra.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// globals are the flags every client verb shares.
type globals struct {
	host, apiKey, output string
	out, errOut          io.Writer
}

// Main runs the CLI and returns the process exit code.
func Main(args []string) int {
	g := &globals{out: os.Stdout, errOut: os.Stderr}
	root := rootCmd(g)
	root.SetArgs(args)
	err := root.Execute()
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	}
	code, msg := errdefs.Code(err), err.Error()
	var he *hutch.Error
	if errors.As(err, &he) {
		code = he.Code
	}
	fmt.Fprintf(g.errOut, "hutch: %s: %s\n", code, strings.ReplaceAll(msg, "\n", "; "))
	return 1
}

func rootCmd(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "hutch",
		Short: "Isolated Linux sandboxes for AI agents, from one static binary",
		Long: "hutch runs isolated Linux sandboxes for AI agents. `hutch serve` runs the daemon; the other " +
			"verbs are its clients and reach it at --host: unix:///path/to/hutch.sock (the default is the " +
			"socket in the data directory, $HUTCH_DATA or ./.hutch) or http(s)://host:port with --api-key.",
		SilenceUsage:      true,
		SilenceErrors:     true,
		Args:              noArgs,
		RunE:              func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		PersistentPreRunE: func(*cobra.Command, []string) error { return g.check() },
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return invalid("%v", err) })
	pf := root.PersistentFlags()
	pf.StringVar(&g.host, "host", os.Getenv("HUTCH_HOST"), "daemon address: unix:///path/hutch.sock or http(s)://host:port ($HUTCH_HOST)")
	pf.StringVar(&g.apiKey, "api-key", os.Getenv("HUTCH_API_KEY"), "API key for TCP hosts ($HUTCH_API_KEY)")
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	root.AddCommand(runCmd(g), serveCmd(), versionCmd(g),
		createCmd(g), lsCmd(g), inspectCmd(g), rmCmd(g),
		execCmd(g), shellCmd(g), cpCmd(g), psCmd(g), logsCmd(g), killCmd(g), keysCmd(g), mcpCmd(g))
	root.AddCommand(lifecycleCmds(g)...)
	root.AddCommand(templateCmds(g)...)
	root.AddCommand(networkCmd(g), portCmd(g))
	return root
}

func (g *globals) check() error {
	if g.output != "table" && g.output != "json" {
		return invalid("-o %q: want table or json", g.output)
	}
	return nil
}

// client connects to --host, or to the default local socket.
func (g *globals) client() (*hutch.Client, error) {
	host := g.host
	if host == "" {
		host = hutch.DefaultHost()
	}
	return hutch.New(host, g.apiKey, hutch.WithUserAgent("hutch-cli/"+Version))
}

// sandbox is a handle on the sandbox id.
func (g *globals) sandbox(id string) (*hutch.Sandbox, error) {
	c, err := g.client()
	if err != nil {
		return nil, err
	}
	return c.Sandbox(id), nil
}

func (g *globals) json() bool { return g.output == "json" }

// print writes v as JSON with -o json, else the table that table writes.
func (g *globals) print(v any, table func(w io.Writer)) error {
	if g.json() {
		enc := json.NewEncoder(g.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

func invalid(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalidArgument, format, args...)
}

// Argument checks that fail as invalid_argument.

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return invalid("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return nil
}

func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return invalid("%s wants %d argument(s), got %d; see %s --help", cmd.CommandPath(), n, len(args), cmd.CommandPath())
		}
		return nil
	}
}

func minArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return invalid("%s wants at least %d argument(s); see %s --help", cmd.CommandPath(), n, cmd.CommandPath())
		}
		return nil
	}
}

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the client's version and, when it answers, the daemon's",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := struct {
				Client string        `json:"client"`
				Daemon *hutch.Health `json:"daemon,omitempty"`
			}{Client: Version}
			if c, err := g.client(); err == nil {
				ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
				defer cancel()
				v.Daemon, _ = c.Health(ctx)
			}
			return g.print(v, func(w io.Writer) {
				fmt.Fprintf(w, "client:\t%s\n", v.Client)
				if v.Daemon != nil {
					fmt.Fprintf(w, "daemon:\t%s (%s backend)\n", v.Daemon.Version, v.Daemon.Backend)
				} else {
					fmt.Fprintf(w, "daemon:\tnot reachable\n")
				}
			})
		},
	}
}

// background is a context for cleanups that must run after ctx ended.
func background(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }
