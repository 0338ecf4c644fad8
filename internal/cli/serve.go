package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/sandbox"
	"github.com/hutch-dev/hutch/internal/server"
	"github.com/hutch-dev/hutch/internal/store"
)

// Version is hutch's version, set at build time with -ldflags.
var Version = "dev"

type serveFlags struct {
	data, socket, listen, logLevel string
	grace                          time.Duration
	warm                           int
	limits                         server.Limits
}

func serveCmd() *cobra.Command {
	var f serveFlags
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon: the API on a unix socket and, with --listen, on TCP",
		Long: "serve runs hutch's daemon on the native backend (it needs root). The unix socket is trusted " +
			"(mode 0600, like Docker's); TCP needs an API key per request (hutch keys create). Stopping " +
			"the daemon leaves sandboxes running; the next start recovers them.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return serve(cmd.Context(), f) },
	}
	fl := c.Flags()
	fl.StringVar(&f.data, "data", defaultDataDir(), "data directory (state, sandboxes, images)")
	fl.StringVar(&f.socket, "socket", "", "unix socket path (default DATA/hutch.sock)")
	fl.StringVar(&f.listen, "listen", "", "also listen on TCP, e.g. 127.0.0.1:7070 (API keys required)")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.DurationVar(&f.grace, "grace", 10*time.Second, "how long running requests get at shutdown")
	fl.IntVar(&f.warm, "warm-inits", 0, "parked inits kept ready (default 2; negative: none)")
	fl.IntVar(&f.limits.MaxCmdBytes, "max-cmd-bytes", 0, "longest command accepted (default 8 KiB)")
	fl.DurationVar(&f.limits.DefaultTimeout, "exec-timeout", 0, "default exec timeout (default 300s)")
	fl.DurationVar(&f.limits.MaxTimeout, "max-exec-timeout", 0, "longest exec timeout a request may ask (default 1h)")
	fl.IntVar(&f.limits.DefaultOutput, "max-output", 0, "bytes of output a buffered exec keeps per stream (default 64 KiB)")
	return c
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

func serve(ctx context.Context, f serveFlags) error {
	log, err := newLogger(f.logLevel)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(f.data, 0o711); err != nil {
		return err
	}
	st, err := store.Open(ctx, filepath.Join(f.data, "hutch.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	be, err := native.New(native.Options{DataDir: f.data, WarmInits: f.warm})
	if err != nil {
		return err
	}
	defer be.Close()
	srv := server.New(server.Config{Store: st, Logger: log, Limits: f.limits, Version: Version})
	mgr, err := sandbox.New(ctx, st, be, sandbox.Options{Logger: log, OnTransition: srv.Metrics()})
	if err != nil {
		return err
	}
	defer mgr.Close()
	srv.SetManager(mgr)
	return listenAndServe(ctx, f, srv, log)
}

func listenAndServe(ctx context.Context, f serveFlags, srv *server.Server, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	sock := f.socket
	if sock == "" {
		sock = filepath.Join(f.data, "hutch.sock")
	}
	lns := []net.Listener{}
	uln, err := server.ListenUnix(sock)
	if err != nil {
		return err
	}
	lns = append(lns, uln)
	if f.listen != "" {
		tln, err := net.Listen("tcp", f.listen)
		if err != nil {
			uln.Close()
			return err
		}
		lns = append(lns, tln)
	}
	addrs := []string{}
	for _, ln := range lns {
		addrs = append(addrs, ln.Addr().Network()+"://"+ln.Addr().String())
	}
	log.Info("hutch serving", "version", Version, "listen", strings.Join(addrs, " "), "data", f.data)
	errc := make(chan error, len(lns))
	for _, ln := range lns {
		go func() { errc <- srv.Serve(ctx, ln, f.grace) }()
	}
	var first error
	for range lns {
		if err := <-errc; err != nil && first == nil {
			first = err
			stop()
		}
	}
	log.Info("hutch stopped; sandboxes keep running")
	return first
}
