package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/netpolicy"
)

const (
	httpIdleTimeout       = 2 * time.Minute
	httpReadHeaderTimeout = 30 * time.Second
)

var discardLog = log.New(io.Discard, "", 0)

// serveHTTP proxies a connection request by request: plain HTTP to an
// admitted name, or (useTLS) TLS terminated with a leaf for name because
// the name has credential rules. Credentials are injected in both cases (a
// credential rule for a host the sandbox talks plain HTTP to applies there
// too). Every request's Host must be name, so a connection opened for one
// host can neither reach another nor carry another host's credentials;
// credentials replace whatever the client sent, and no secret value of the
// policy comes back in a response header.
func (p *Proxy) serveHTTP(ctx context.Context, cn *conn, name string, useTLS bool) {
	// The transport finishes a dial even after its request is gone (for
	// reuse); dials are tied to this connection instead, so none outlives
	// it.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cn.d.Intercepted = true
	counted := &countConn{Conn: &prefixConn{Conn: cn.c, head: cn.head}}
	defer func() {
		cn.d.BytesUp, cn.d.BytesDown = counted.read.Load(), counted.written.Load()
	}()
	var client net.Conn = counted
	if useTLS {
		leaf, err := p.cfg.CA.Leaf(name)
		if err != nil {
			cn.d.Reason = "leaf certificate: " + err.Error()
			return
		}
		tc := tls.Server(counted, &tls.Config{
			Certificates: []tls.Certificate{*leaf},
			NextProtos:   []string{"http/1.1"},
			MinVersion:   tls.VersionTLS12,
		})
		hctx, cancel := context.WithTimeout(ctx, p.cfg.PeekTimeout)
		err = tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			cn.d.Reason = "client TLS handshake: " + err.Error()
			return
		}
		client = tc
	}
	h := p.newHTTPHandler(ctx, cn, name)
	defer h.tr.CloseIdleConnections()
	cn.d.Allowed, cn.d.Reason = true, "name allowed"
	if h.creds != nil {
		cn.d.Reason = "name allowed, credentials injected"
	}
	serveOneConn(ctx, client, h)
	if ip, ok := h.dialed.Load().(netip.Addr); ok {
		cn.d.IP = ip
	} else if e, ok := h.dialErr.Load().(errBox); ok {
		// Nothing went out: the decision is what the dial check said.
		cn.d.Allowed, cn.d.Reason = false, e.err.Error()
	}
}

// httpHandler serves the requests of one client connection.
type httpHandler struct {
	p       *Proxy
	pol     *netpolicy.Compiled
	src     netip.Addr // the sandbox's address, to look its policy up again
	name    string
	creds   map[string]string
	secrets []string
	tr      *http.Transport
	rp      *httputil.ReverseProxy
	dialed  atomic.Value // netip.Addr of the last upstream dial
	dialErr atomic.Value // errBox of the last failed one
}

// errBox gives atomic.Value one concrete type for every error.
type errBox struct{ err error }

func (p *Proxy) newHTTPHandler(connCtx context.Context, cn *conn, name string) *httpHandler {
	h := &httpHandler{p: p, pol: cn.pol, src: cn.src, name: name, secrets: cn.pol.SecretValues(), creds: cn.pol.Credentials(name)}
	scheme := "http"
	if cn.d.Proto == "tls" {
		scheme = "https"
	}
	hostport := net.JoinHostPort(name, portString(cn.d.Port))
	h.tr = h.transport(connCtx, cn.d.Port)
	h.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = scheme, hostport
			pr.Out.Host = pr.In.Host
			// Set after the hop-by-hop headers are gone: a header the
			// client listed in Connection cannot remove a credential.
			for k, v := range h.creds {
				pr.Out.Header.Set(k, v)
			}
		},
		Transport:      h.tr,
		FlushInterval:  -1, // stream (server-sent events, long polls) as it arrives
		ErrorLog:       discardLog,
		ModifyResponse: h.modifyResponse,
		ErrorHandler:   h.errorHandler,
	}
	return h
}

// transport is the connection's own upstream transport: every dial goes
// through the proxy's checked path to the connection's name, and upstream
// certificates are verified against UpstreamRoots.
func (h *httpHandler) transport(connCtx context.Context, port int) *http.Transport {
	p, name := h.p, h.name
	// bind ends a dial when either the transport gives up on it or the
	// client connection is done.
	bind := func(ctx context.Context) (context.Context, func()) {
		ctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(connCtx, cancel)
		return ctx, func() { stop(); cancel() }
	}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		ctx, done := bind(ctx)
		defer done()
		// Each dial is judged by the sandbox's policy now, not the one the
		// connection started under (Revalidate closes the connection if
		// the name or its credentials changed).
		_, pol, ok := p.cfg.Lookup(h.src)
		if !ok || pol == nil {
			err := errdefs.New(errRefused, "the sandbox's policy is gone")
			h.dialErr.Store(errBox{err})
			return nil, err
		}
		if !pol.HostAllowed(name, port) {
			err := errdefs.New(errRefused, "%s is no longer allowed on port %d", name, port)
			h.dialErr.Store(errBox{err})
			return nil, err
		}
		c, ip, err := p.dialName(ctx, pol, name, port)
		if err != nil {
			h.dialErr.Store(errBox{err})
			return nil, err
		}
		h.dialed.Store(ip)
		return c, nil
	}
	return &http.Transport{
		// Proxy stays nil: the environment's proxy settings must not
		// redirect a sandbox's traffic.
		DialContext: dial,
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ctx, done := bind(ctx)
			defer done()
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, &tls.Config{ServerName: name, RootCAs: p.cfg.UpstreamRoots,
				NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				return nil, err
			}
			return tc, nil
		},
		TLSNextProto:          map[string]func(string, *tls.Conn) http.RoundTripper{}, // HTTP/1.1 only
		DisableCompression:    true,                                                   // pass bodies through as they are
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       httpIdleTimeout,
		TLSHandshakeTimeout:   dialTimeout,
		ExpectContinueTimeout: time.Second,
	}
}

func (h *httpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		http.Error(w, "hutch egress: CONNECT is not proxied", http.StatusMethodNotAllowed)
		return
	}
	if normalizeName(r.Host) != h.name {
		// 421 tells a client to retry on a new connection, which then
		// gets its own name check (and its own credentials, if any).
		http.Error(w, "hutch egress: this connection is for "+h.name+", not "+r.Host, http.StatusMisdirectedRequest)
		return
	}
	h.rp.ServeHTTP(&scrubWriter{ResponseWriter: w, secrets: h.secrets}, r)
}

// modifyResponse drops response headers that carry a secret, and makes
// sure the trailers are checked too once the body has been read.
func (h *httpHandler) modifyResponse(r *http.Response) error {
	scrubHeader(r.Header, h.secrets)
	// A 101's body is the upgraded connection itself (it must stay an
	// io.ReadWriteCloser) and has no trailers.
	if len(h.secrets) > 0 && r.Body != nil && r.StatusCode != http.StatusSwitchingProtocols {
		r.Body = &scrubTrailerBody{ReadCloser: r.Body, resp: r, secrets: h.secrets}
	}
	return nil
}

func (h *httpHandler) errorHandler(w http.ResponseWriter, _ *http.Request, err error) {
	status, msg := http.StatusBadGateway, "upstream unavailable"
	switch {
	case errors.Is(err, errRefused):
		status, msg = http.StatusForbidden, "the name resolves to no address the policy allows"
	case errors.Is(err, context.Canceled):
		return // the client went away
	}
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &certErr) {
		msg = "upstream certificate not trusted"
	}
	http.Error(w, "hutch egress: "+msg, status)
}

// scrubHeader deletes every header whose value contains a secret.
func scrubHeader(hdr http.Header, secrets []string) {
	if len(secrets) == 0 {
		return
	}
	for k, vs := range hdr {
		for _, v := range vs {
			if containsAny(v, secrets) {
				delete(hdr, k)
				break
			}
		}
	}
}

func containsAny(v string, secrets []string) bool {
	for _, s := range secrets {
		if strings.Contains(v, s) {
			return true
		}
	}
	return false
}

// scrubWriter scrubs the headers at every WriteHeader: the reverse proxy
// forwards 1xx responses (103 Early Hints) straight to the writer,
// bypassing ModifyResponse.
type scrubWriter struct {
	http.ResponseWriter
	secrets []string
}

func (w *scrubWriter) WriteHeader(code int) {
	scrubHeader(w.Header(), w.secrets)
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach Flush and Hijack (streaming,
// protocol upgrades).
func (w *scrubWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// scrubTrailerBody scrubs the response trailers, which the transport
// fills in only when the body reaches EOF.
type scrubTrailerBody struct {
	io.ReadCloser
	resp    *http.Response
	secrets []string
}

func (b *scrubTrailerBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		scrubHeader(b.resp.Trailer, b.secrets)
	}
	return n, err
}

// serveOneConn serves HTTP on one connection and returns when that
// connection is done: closed, or hijacked (an upgrade) and its handler has
// returned. ctx ending closes it.
func serveOneConn(ctx context.Context, c net.Conn, h http.Handler) {
	done := make(chan struct{})
	var once sync.Once
	finish := func() { once.Do(func() { close(done) }) }
	var hijacked atomic.Bool
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(w, r)
			if hijacked.Load() {
				c.Close()
				finish()
			}
		}),
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ReadHeaderTimeout: httpReadHeaderTimeout,
		IdleTimeout:       httpIdleTimeout,
		ErrorLog:          discardLog,
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ConnState: func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateClosed:
				finish()
			case http.StateHijacked:
				hijacked.Store(true)
			}
		},
	}
	stop := context.AfterFunc(ctx, func() {
		srv.Close()
		c.Close() // a hijacked connection is no longer the server's to close
	})
	defer stop()
	l := &oneConnListener{c: c, done: done}
	srv.Serve(l)
	if l.used {
		// Serve returns as soon as Accept fails; the connection's own
		// goroutine may still be running until it is closed.
		<-done
	} else {
		c.Close() // ctx ended before Serve took the connection
	}
}

// oneConnListener hands out one connection, then blocks until it is done.
type oneConnListener struct {
	c    net.Conn
	done <-chan struct{}
	used bool
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	if !l.used {
		l.used = true
		return l.c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }

// prefixConn replays head before reading from the connection.
type prefixConn struct {
	net.Conn
	head []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// countConn counts the bytes read from and written to a connection.
type countConn struct {
	net.Conn
	read, written atomic.Int64
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}
