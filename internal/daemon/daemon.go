// Package daemon assembles hutch's daemon from its parts (store, native
// backend, manager, HTTP server, listeners) so that `hutch serve` and the
// tests start exactly the same thing.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/blob"
	"github.com/hutch-dev/hutch/internal/e2b"
	"github.com/hutch-dev/hutch/internal/mcp"
	"github.com/hutch-dev/hutch/internal/netpolicy/gateway"
	"github.com/hutch-dev/hutch/internal/sandbox"
	"github.com/hutch-dev/hutch/internal/server"
	"github.com/hutch-dev/hutch/internal/store"
)

// Config configures a daemon.
type Config struct {
	DataDir string
	Socket  string // default DataDir/hutch.sock
	Listen  string // optional TCP address, e.g. 127.0.0.1:7070 (":0" picks a port)
	Logger  *slog.Logger
	Limits  server.Limits
	Version string
	// WarmInits is the native backend's pool of parked inits.
	WarmInits int
	// Grace is how long running requests get at shutdown (default 10s).
	Grace time.Duration
	// ArchiveCap bounds a suspended sandbox's archive (default 256 MiB).
	ArchiveCap int64
	// ReapInterval is how often lifecycle timers are checked (default 1s).
	ReapInterval time.Duration
	// PoolInterval is how often warm pools are refilled and unused
	// template layers collected (default 2s).
	PoolInterval time.Duration
	// Domain routes E2B SDK hosts on the TCP listener: 49983-<id>.Domain
	// to the sandbox's envd and api.Domain to the E2B control API.
	Domain string
	// Network turns sandbox networking on (the router, egress proxy and
	// resolver of internal/netpolicy/gateway); nil: every sandbox is
	// deny-all. NetworkOptional starts the daemon without it, with a
	// warning, when it cannot be set up (no nftables, say).
	Network         *gateway.Options
	NetworkOptional bool
}

// Daemon is a running daemon.
type Daemon struct {
	Socket  string
	TCPAddr string // "" without TCP
	Store   *store.Store
	Manager *sandbox.Manager
	Backend *native.Backend
	Network *gateway.Gateway // nil without networking

	cancel  context.CancelFunc
	errc    chan error
	n       int
	closers []func() error
}

// Start opens everything and starts serving. Stop (or ctx ending) stops
// it; sandboxes keep running either way.
func Start(ctx context.Context, cfg Config) (_ *Daemon, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Grace == 0 {
		cfg.Grace = 10 * time.Second
	}
	if err := os.MkdirAll(cfg.DataDir, 0o711); err != nil {
		return nil, err
	}
	d := &Daemon{Socket: cfg.Socket}
	if d.Socket == "" {
		d.Socket = filepath.Join(cfg.DataDir, "hutch.sock")
	}
	var closers []func() error
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				_ = closers[i]()
			}
		}
	}()
	if d.Store, err = store.Open(ctx, filepath.Join(cfg.DataDir, "hutch.db")); err != nil {
		return nil, err
	}
	closers = append(closers, d.Store.Close)
	nopts := native.Options{DataDir: cfg.DataDir, WarmInits: cfg.WarmInits}
	if cfg.Network != nil {
		gopts := *cfg.Network
		gopts.DataDir, gopts.Logger = cfg.DataDir, cfg.Logger
		switch d.Network, err = gateway.New(gopts); {
		case err == nil:
			closers = append(closers, d.Network.Close)
			nopts.Nameserver, nopts.CA = d.Network.Nameserver().String(), d.Network.CAPEM()
		case cfg.NetworkOptional:
			cfg.Logger.Warn("sandbox networking is off: every sandbox is deny-all", "err", err)
			d.Network, err = nil, nil
		default:
			return nil, fmt.Errorf("sandbox networking: %w", err)
		}
	}
	if d.Backend, err = native.New(nopts); err != nil {
		return nil, err
	}
	closers = append(closers, d.Backend.Close)
	blobs, err := blob.NewDir(filepath.Join(cfg.DataDir, "archives"))
	if err != nil {
		return nil, err
	}
	srv := server.New(server.Config{Store: d.Store, Logger: cfg.Logger, Limits: cfg.Limits, Version: cfg.Version, Domain: cfg.Domain})
	var network sandbox.Network
	if d.Network != nil {
		network = d.Network
		if err := srv.Register(d.Network.Collectors()...); err != nil {
			return nil, err
		}
	}
	if d.Manager, err = sandbox.New(ctx, d.Store, d.Backend, sandbox.Options{Logger: cfg.Logger,
		OnTransition: srv.Metrics(), Blobs: blobs, ArchiveCap: cfg.ArchiveCap, ReapInterval: cfg.ReapInterval,
		LayerDir: filepath.Join(cfg.DataDir, "layers"), PoolInterval: cfg.PoolInterval, Network: network}); err != nil {
		return nil, err
	}
	closers = append(closers, d.Manager.Close)
	srv.SetManager(d.Manager)
	srv.Mount("/mcp", mcp.Handler(srv.InProcess, cfg.Version))
	// The TCP listener also speaks the e2b SDK's protocols (internal/e2b);
	// the unix socket is hutch's API only.
	e2bh, err := e2b.New(e2b.Config{Store: d.Store, Manager: d.Manager, Logger: cfg.Logger, Domain: cfg.Domain,
		SecretFile: filepath.Join(cfg.DataDir, "e2b.secret")})
	if err != nil {
		return nil, err
	}
	closers = append(closers, e2bh.Close)
	srv.WrapTCP(e2bh.Wrap)
	lns, err := d.listen(cfg)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	d.cancel, d.errc, d.n = cancel, make(chan error, len(lns)), len(lns)
	for _, ln := range lns {
		go func() { d.errc <- srv.Serve(sctx, ln, cfg.Grace) }()
	}
	d.closers = closers
	cfg.Logger.Info("hutch serving", "version", cfg.Version, "socket", d.Socket, "tcp", d.TCPAddr, "data", cfg.DataDir)
	return d, nil
}

func (d *Daemon) listen(cfg Config) ([]net.Listener, error) {
	uln, err := server.ListenUnix(d.Socket)
	if err != nil {
		return nil, err
	}
	lns := []net.Listener{uln}
	if cfg.Listen != "" {
		tln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			uln.Close()
			return nil, err
		}
		d.TCPAddr = tln.Addr().String()
		lns = append(lns, tln)
	}
	return lns, nil
}

// Wait blocks until every listener has stopped, closes the manager, backend
// and store, and returns the first error.
func (d *Daemon) Wait() error {
	var first error
	for range d.n {
		if err := <-d.errc; err != nil && !errors.Is(err, net.ErrClosed) && first == nil {
			first = err
			d.cancel()
		}
	}
	d.n = 0
	for i := len(d.closers) - 1; i >= 0; i-- {
		_ = d.closers[i]()
	}
	d.closers = nil
	return first
}

// Stop shuts the daemon down gracefully and waits for it.
func (d *Daemon) Stop() error {
	d.cancel()
	return d.Wait()
}
