// Package server is hutch's HTTP edge: it serves api/openapi.yaml over a
// unix socket (trusted) and TCP (API keys, one tenant per key), turns
// requests into manager calls, streams output as NDJSON, SSE or WebSocket,
// and maps the errdefs vocabulary to HTTP statuses in exactly one place.
package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/sandbox"
	"github.com/hutch-dev/hutch/internal/store"
)

// Limits bound what one request may ask for.
type Limits struct {
	MaxCmdBytes    int           // default 8 KiB
	MaxStdinBytes  int64         // buffered exec stdin, default 1 MiB
	MaxBodyBytes   int64         // JSON bodies, default 2 MiB
	DefaultTimeout time.Duration // exec, default 300s
	MaxTimeout     time.Duration // exec, default 3600s
	DefaultOutput  int           // bytes kept per stream by buffered exec, default 64 KiB
	MaxOutput      int           // the most a request may ask to keep, default 16 MiB
}

func (l *Limits) defaults() {
	if l.MaxCmdBytes == 0 {
		l.MaxCmdBytes = 8 << 10
	}
	if l.MaxStdinBytes == 0 {
		l.MaxStdinBytes = 1 << 20
	}
	if l.MaxBodyBytes == 0 {
		l.MaxBodyBytes = 2 << 20
	}
	if l.DefaultTimeout == 0 {
		l.DefaultTimeout = 300 * time.Second
	}
	if l.MaxTimeout == 0 {
		l.MaxTimeout = time.Hour
	}
	if l.DefaultOutput == 0 {
		l.DefaultOutput = 64 << 10
	}
	if l.MaxOutput == 0 {
		l.MaxOutput = 16 << 20
	}
}

// Config is what a Server needs.
type Config struct {
	Manager *sandbox.Manager
	Store   *store.Store
	Logger  *slog.Logger
	Limits  Limits
	Version string
	// Domain, when set, routes http://{port}-{id}.{Domain}/ to the exposed
	// ports of sandboxes.
	Domain string
}

// Server serves the API.
type Server struct {
	cfg     Config
	mgr     *sandbox.Manager
	st      *store.Store
	log     *slog.Logger
	lim     Limits
	metrics *metrics
	handler http.Handler
	mux     *http.ServeMux // the routes behind the middleware; Mount adds to it
	wrapTCP func(http.Handler) http.Handler
}

var _ api.ServerInterface = (*Server)(nil)

// New makes a server.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Limits.defaults()
	s := &Server{cfg: cfg, mgr: cfg.Manager, st: cfg.Store, log: cfg.Logger, lim: cfg.Limits, metrics: newMetrics()}
	s.handler = s.routes()
	return s
}

// SetManager attaches the manager (made after the server, so that it can
// report transitions to the server's metrics) and seeds the state gauge.
func (s *Server) SetManager(m *sandbox.Manager) {
	s.mgr = m
	s.cfg.Manager = m
	s.seedStates(context.Background())
}

// seedStates sets the state gauge from the store: transitions only move
// it, so without a start it would count from zero (negative, after
// recovery marks a sandbox failed).
func (s *Server) seedStates(ctx context.Context) {
	counts := map[sandbox.State]int{}
	for token := ""; ; {
		sbs, next, err := s.mgr.List(ctx, "", sandbox.ListOptions{Limit: 1000, PageToken: token})
		if err != nil {
			s.log.Warn("seed sandbox metrics", "err", err)
			return
		}
		for _, sb := range sbs {
			counts[sb.State]++
		}
		if token = next; token == "" {
			break
		}
	}
	s.metrics.states.Reset()
	s.SeedStates(counts)
}

// Handler is the whole HTTP surface.
func (s *Server) Handler() http.Handler { return s.handler }

// Metrics returns the transition hook the manager should call, so sandbox
// counts by state stay current.
func (s *Server) Metrics() func(from, to sandbox.State) { return s.metrics.transition }

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/openapi.yaml", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(api.Spec)
	})
	mux.Handle("GET /metrics", s.metrics.handler())
	api.HandlerWithOptions(s, api.StdHTTPServerOptions{
		BaseURL:    "/v1",
		BaseRouter: mux,
		ErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			s.fail(w, r, invalid("%v", err))
		},
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, notFound("no route for %s %s", r.Method, r.URL.Path))
	})
	s.mux = mux
	return s.recoverPanics(s.requestID(s.authenticate(s.logRequests(mux))))
}

// trustedKey marks connections from the unix socket.
type trustedKey struct{}

// Serve serves on ln until ctx ends, then shuts down gracefully: new
// requests are refused and running ones get up to grace to finish.
// Connections on a unix listener are trusted; others need an API key.
func (s *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	_, trusted := ln.(*net.UnixListener)
	h := s.handler
	if !trusted && s.wrapTCP != nil {
		h = s.wrapTCP(h)
	}
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		ConnContext: func(c context.Context, _ net.Conn) context.Context {
			return context.WithValue(c, trustedKey{}, trusted)
		},
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := hs.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = hs.Close()
	}
	<-errc
	return err
}

// WrapTCP puts w around the handler of every listener but the unix
// socket (the E2B routes answer only there). Call it before Serve.
func (s *Server) WrapTCP(w func(http.Handler) http.Handler) { s.wrapTCP = w }

// ListenUnix makes the daemon's socket: mode 0600, a stale one replaced.
func ListenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, errors.New("another daemon is listening on " + path)
		}
		_ = os.Remove(path)
	}
	// No umask dance: the umask is per process, and changing it would race
	// with every file and child made meanwhile. A socket needs write
	// permission to connect, which the default modes never give others.
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
