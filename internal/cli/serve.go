package cli

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/hutch-dev/hutch/internal/daemon"
	"github.com/hutch-dev/hutch/internal/netpolicy/gateway"
	"github.com/hutch-dev/hutch/internal/netpolicy/router"
)

// Version is hutch's version, set at build time with -ldflags.
var Version = "dev"

func serveCmd() *cobra.Command {
	var cfg daemon.Config
	var logLevel string
	var netFlags serveNetFlags
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
			if err := netFlags.apply(&cfg); err != nil {
				return err
			}
			return serve(cmd.Context(), cfg)
		},
	}
	fl := c.Flags()
	fl.StringVar(&cfg.DataDir, "data", defaultDataDir(), "data directory (state, sandboxes, images)")
	fl.StringVar(&cfg.Socket, "socket", "", "unix socket path (default DATA/hutch.sock)")
	fl.StringVar(&cfg.Listen, "listen", "", "also listen on TCP, e.g. 127.0.0.1:7070 (API keys required)")
	fl.StringVar(&cfg.Domain, "domain", "", "route http://PORT-ID.DOMAIN to sandboxes' exposed ports (49983: E2B's envd) and api.DOMAIN to the E2B API")
	fl.StringVar(&netFlags.mode, "network", "auto", "sandbox networking: on, off, or auto (on when this host allows it)")
	fl.StringVar(&netFlags.subnet, "network-subnet", "10.213.0.0/16", "IPv4 range for sandboxes' links, a /30 each")
	fl.StringVar(&netFlags.egressNS, "egress-netns", "", "network namespace file to make sandboxes' outbound connections from (default: the daemon's)")
	fl.StringVar(&netFlags.dns, "dns-upstream", "", "DNS server (ip:port) that resolves allowed names (default: the system's)")
	fl.StringVar(&netFlags.upstreamCA, "upstream-ca", "", "PEM file of extra CAs trusted for hosts whose requests get credentials injected")
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

// serveNetFlags are serve's networking flags.
type serveNetFlags struct {
	mode, subnet, egressNS, dns, upstreamCA string
}

func (f serveNetFlags) apply(cfg *daemon.Config) error {
	switch f.mode {
	case "off":
		return nil
	case "on", "auto":
	default:
		return fmt.Errorf("--network %q: want on, off or auto", f.mode)
	}
	subnet, err := netip.ParsePrefix(f.subnet)
	if err != nil {
		return fmt.Errorf("--network-subnet: %w", err)
	}
	opts := &gateway.Options{Router: router.Options{Subnet: subnet}, EgressNetNS: f.egressNS, DNSUpstream: f.dns}
	if f.dns != "" {
		if _, err := netip.ParseAddrPort(f.dns); err != nil {
			return fmt.Errorf("--dns-upstream %q: want ip:port", f.dns)
		}
	}
	if f.upstreamCA != "" {
		pem, err := os.ReadFile(f.upstreamCA)
		if err != nil {
			return fmt.Errorf("--upstream-ca: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("--upstream-ca %s: no PEM certificate in it", f.upstreamCA)
		}
		opts.UpstreamRoots = pool
	}
	cfg.Network, cfg.NetworkOptional = opts, f.mode == "auto"
	return nil
}
