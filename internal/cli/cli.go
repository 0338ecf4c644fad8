// Package cli is hutch's command line: every verb of the hutch binary. It
// is kept apart from cmd/hutch so main stays thin and the commands can be
// tested as a user types them.
package cli

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// exitError carries a process exit code through cobra.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Main runs the CLI and returns the process exit code.
func Main(args []string) int {
	root := &cobra.Command{
		Use:           "hutch",
		Short:         "Isolated Linux sandboxes for AI agents, from one static binary",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(runCmd(), serveCmd())
	root.SetArgs(args)
	err := root.Execute()
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	}
	fmt.Fprintf(os.Stderr, "hutch: %s: %v\n", errdefs.Code(err), err)
	return 1
}
