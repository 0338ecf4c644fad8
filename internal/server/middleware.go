package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

type ctxKey int

const (
	requestIDKey ctxKey = iota
	tenantKey
)

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

// Tenant is who a request acts for: "" for the trusted local socket (every
// sandbox), else the tenant of its API key.
type Tenant struct {
	ID      string
	Trusted bool
}

func tenantOf(ctx context.Context) Tenant {
	t, _ := ctx.Value(tenantKey).(Tenant)
	return t
}

func (s *Server) requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		id := "req_" + hex.EncodeToString(b)
		w.Header().Set("X-Request-Id", id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey, id)))
	})
}

// authenticate admits the unix socket as trusted and everything else by
// API key; the spec, health and metrics need no key.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if trusted, _ := r.Context().Value(trustedKey{}).(bool); trusted {
			ctx := context.WithValue(r.Context(), tenantKey, Tenant{Trusted: true})
			if id, port, path, isPort := s.portTarget(r); isPort {
				s.servePort(w, r.WithContext(ctx), id, port, path)
				return
			}
			next.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		switch r.URL.Path {
		case "/v1/health", "/v1/openapi.yaml", "/metrics":
			next.ServeHTTP(w, r)
			return
		}
		secret, ok := bearer(r)
		if id, port, path, isPort := s.portTarget(r); isPort {
			// An exposed port decides for itself (key, token or public);
			// a bearer that is no hutch key belongs to the sandbox's app.
			t := Tenant{}
			if ok {
				if key, err := s.st.Authenticate(r.Context(), secret); err == nil {
					t.ID = key.Tenant
				}
			}
			s.servePort(w, r.WithContext(context.WithValue(r.Context(), tenantKey, t)), id, port, path)
			return
		}
		if !ok {
			s.fail(w, r, errdefs.New(errdefs.ErrUnauthenticated, "this listener needs an API key: Authorization: Bearer <key>"))
			return
		}
		key, err := s.st.Authenticate(r.Context(), secret)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey, Tenant{ID: key.Tenant})))
	})
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, secret, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(secret) == "" {
		return "", false
	}
	return strings.TrimSpace(secret), true
}

// statusWriter remembers the status for logs and metrics. It passes
// Flush and Unwrap through, which streaming and WebSockets need.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", sw.status,
			"duration", time.Since(start), "request_id", requestID(r.Context()), "tenant", tenantOf(r.Context()).ID)
	})
}

// recoverPanics turns a handler panic into a 500 with a request id; the
// daemon keeps serving.
func (s *Server) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic", "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
				s.fail(w, r, fmt.Errorf("panic: %v", v))
			}
		}()
		next.ServeHTTP(w, r)
	})
}
