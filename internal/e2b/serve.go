package e2b

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Serve serves handler on ln until ctx ends, then shuts down gracefully:
// running requests get up to grace. The daemon uses it for the TCP
// listener, whose handler is hutch's own wrapped by Handler.Wrap.
func Serve(ctx context.Context, ln net.Listener, handler http.Handler, grace time.Duration, log *slog.Logger) error {
	hs := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
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
