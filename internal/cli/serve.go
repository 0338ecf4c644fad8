package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/hutch-dev/hutch/internal/daemon"
)

// Version is hutch's version, set at build time with -ldflags.
var Version = "dev"

func serveCmd() *cobra.Command {
	var cfg daemon.Config
	var logLevel string
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon: the API on a unix socket and, with --listen, on TCP",
		Long: "serve runs hutch's daemon on the native backend (it needs root). The unix socket is trusted " +
			"(mode 0600, like Docker's); TCP needs an API key per request (hutch keys create). Stopping " +
			"the daemon leaves sandboxes running; the next start recovers them.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			cfg.Logger, cfg.Version = log, Version
			return serve(cmd.Context(), cfg)
		},
	}
	fl := c.Flags()
	fl.StringVar(&cfg.DataDir, "data", defaultDataDir(), "data directory (state, sandboxes, images)")
	fl.StringVar(&cfg.Socket, "socket", "", "unix socket path (default DATA/hutch.sock)")
	fl.StringVar(&cfg.Listen, "listen", "", "also listen on TCP, e.g. 127.0.0.1:7070 (API keys required)")
	fl.StringVar(&cfg.Domain, "domain", "", "E2B SDK domain: route 49983-<id>.DOMAIN to envd and api.DOMAIN to the E2B API")
	fl.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fl.DurationVar(&cfg.Grace, "grace", 10*time.Second, "how long running requests get at shutdown")
	fl.IntVar(&cfg.WarmInits, "warm-inits", 0, "parked inits kept ready (default 2; negative: none)")
	fl.Int64Var(&cfg.ArchiveCap, "archive-cap", 0, "largest archive a suspend may write, in bytes (default 256 MiB)")
	fl.IntVar(&cfg.Limits.MaxCmdBytes, "max-cmd-bytes", 0, "longest command accepted (default 8 KiB)")
	fl.DurationVar(&cfg.Limits.DefaultTimeout, "exec-timeout", 0, "default exec timeout (default 300s)")
	fl.DurationVar(&cfg.Limits.MaxTimeout, "max-exec-timeout", 0, "longest exec timeout a request may ask (default 1h)")
	fl.IntVar(&cfg.Limits.DefaultOutput, "max-output", 0, "bytes of output a buffered exec keeps per stream (default 64 KiB)")
	return c
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

func serve(ctx context.Context, cfg daemon.Config) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	d, err := daemon.Start(ctx, cfg)
	if err != nil {
		return err
	}
	err = d.Wait()
	cfg.Logger.Info("hutch stopped; sandboxes keep running")
	return err
}
