package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Mount serves h at pattern (a ServeMux pattern such as "/mcp") behind the
// API's own middleware: request ids, panics caught, and the same
// authentication (the unix socket is trusted, TCP needs an API key), so h
// can act for its caller through InProcess. Call it before Serve.
func (s *Server) Mount(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// InProcess returns a transport that answers requests with this server's
// own API handler, without a socket, as the caller of r: r must have
// reached a handler given to Mount, so it has been authenticated. The
// identity is taken from r and kept by the transport, never read from the
// requests it carries, so a mounted handler cannot act for anyone else.
func (s *Server) InProcess(r *http.Request) http.RoundTripper {
	return &inProcess{s: s, tenant: tenantOf(r.Context())}
}

type inProcess struct {
	s      *Server
	tenant Tenant
}

// RoundTrip runs the API handler on its own goroutine and hands back the
// response as soon as its header is written, so streams (NDJSON output)
// arrive as they are made. Closing the body cancels the handler's context;
// the goroutine ends when the handler returns.
func (t *inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.tenant.Trusted && t.tenant.ID == "" {
		// Only an authenticated request can lend its identity; tenant ""
		// untrusted would otherwise read as "every sandbox" below.
		return nil, errdefs.New(errdefs.ErrUnauthenticated, "in-process call without an authenticated caller")
	}
	ctx, cancel := context.WithCancel(context.WithValue(req.Context(), tenantKey, t.tenant))
	in := req.Clone(ctx)
	in.RequestURI = in.URL.RequestURI()
	in.RemoteAddr = "in-process"
	if in.Body == nil {
		in.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, body: pw, ready: make(chan struct{})}
	go t.serve(w, in, pw)
	<-w.ready
	return &http.Response{Status: fmt.Sprintf("%d %s", w.status, http.StatusText(w.status)), StatusCode: w.status, Header: w.sent,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, ContentLength: -1, Request: req,
		Body: &cancelBody{ReadCloser: pr, cancel: cancel}}, nil
}

func (t *inProcess) serve(w *pipeWriter, in *http.Request, pw *io.PipeWriter) {
	defer func() {
		// net/http swallows http.ErrAbortHandler (recoverPanics re-raises
		// it); here it must only cut the body short, not crash the daemon.
		if v := recover(); v != nil {
			w.writeHeader(http.StatusInternalServerError)
			pw.CloseWithError(io.ErrUnexpectedEOF)
			return
		}
		w.writeHeader(http.StatusOK)
		pw.Close()
	}()
	t.s.recoverPanics(t.s.requestID(t.s.logRequests(t.s.mux))).ServeHTTP(w, in)
}

// cancelBody ends the handler's context when the caller closes the body.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	b.cancel()
	return b.ReadCloser.Close()
}

// pipeWriter is an http.ResponseWriter whose body goes into a pipe. The
// header is copied when first written, as net/http does, so later changes
// to the map do not race with the reader.
type pipeWriter struct {
	header http.Header
	body   *io.PipeWriter
	once   sync.Once
	ready  chan struct{}
	status int
	sent   http.Header
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) WriteHeader(code int) { w.writeHeader(code) }

func (w *pipeWriter) writeHeader(code int) {
	w.once.Do(func() {
		w.status, w.sent = code, w.header.Clone()
		close(w.ready)
	})
}

func (w *pipeWriter) Write(b []byte) (int, error) {
	w.writeHeader(http.StatusOK)
	return w.body.Write(b)
}

// Flush sends the header; the pipe has no buffer to flush.
func (w *pipeWriter) Flush() { w.writeHeader(http.StatusOK) }
