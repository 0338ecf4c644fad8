package cli

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"

	sdkmcp "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/hutch-dev/hutch/internal/mcp"
)

func mcpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve MCP (Model Context Protocol) on stdin/stdout, acting on the daemon at --host",
		Long: "mcp serves hutch's MCP tools (create, list and destroy sandboxes; run commands; background " +
			"processes; files) over stdio, for an MCP client that starts it as a command. It is a client of " +
			"the daemon like the other verbs: --host/$HUTCH_HOST (default the local socket) and, for TCP, " +
			"--api-key/$HUTCH_API_KEY. The daemon also serves the same tools at /mcp (streamable HTTP).",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			t := &sdkmcp.IOTransport{Reader: io.NopCloser(cmd.InOrStdin()), Writer: nopWriteCloser{g.out}}
			err = mcp.New(c, Version, nil).Run(ctx, t)
			if errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
				return nil // the client hung up or we were told to stop: a normal end
			}
			return err
		},
	}
}

// nopWriteCloser keeps the transport from closing our stdout.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
