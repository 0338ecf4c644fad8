package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/netpolicy"
)

// TestMain fails the run if a test leaves goroutines behind: Serve owns
// every goroutine it starts, and ends them all with its context.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(5 * time.Second)
		left := leftover()
		for len(left) > 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			left = leftover()
		}
		if len(left) > 0 {
			fmt.Fprintf(os.Stderr, "%d goroutines left over:\n\n%s\n", len(left), strings.Join(left, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

// leftover returns the stacks of the goroutines other than this one and
// the runtime's (the signal loop the fuzzer and go test start).
func leftover() []string {
	buf := make([]byte, 1<<20)
	var out []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")[1:] {
		if !strings.Contains(g, "os/signal.loop") {
			out = append(out, g)
		}
	}
	return out
}

// world is a small fake internet on loopback. Names resolve to addresses
// in the documentation ranges (public as far as the policy is concerned),
// and the proxy's Dial maps those to loopback servers, so the production
// checks (loopback and private ranges always denied) stay in force.
type world struct {
	t        testing.TB
	upCA     *CA            // signs the upstream servers' certificates
	roots    *x509.CertPool // trusts upCA
	hutchCA  *CA
	names    map[string][]netip.Addr
	backends map[netip.AddrPort]string // fake address -> real loopback address
	dials    sync.Map                  // fake address string -> *atomic.Int64
	lookups  sync.Map                  // name -> *atomic.Int64

	pol       atomic.Pointer[netpolicy.Compiled]
	orig      origMap
	decisions chan Decision

	proxyAddr string
	dnsUDP    string
	dnsTCP    string
	cancel    context.CancelFunc
	served    chan error
	proxy     *Proxy
}

var (
	ipAllowed  = netip.MustParseAddr("203.0.113.10")
	ipEvil     = netip.MustParseAddr("203.0.113.66")
	ipAPI      = netip.MustParseAddr("203.0.113.20")
	ipOther    = netip.MustParseAddr("203.0.113.21")
	ipSrvFirst = netip.MustParseAddr("198.51.100.30")
)

// newWorld starts the upstream servers, a proxy and a resolver with
// policy pol, all stopped at the end of the test.
func newWorld(t testing.TB, pol netpolicy.Policy, tweak ...func(*Config)) *world {
	t.Helper()
	w := &world{t: t, names: map[string][]netip.Addr{}, backends: map[netip.AddrPort]string{}, decisions: make(chan Decision, 1000)}
	w.orig.m = map[string]netip.AddrPort{}
	w.orig.waiters = map[string]chan struct{}{}
	var err error
	if w.upCA, err = LoadOrCreateCA(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if w.hutchCA, err = LoadOrCreateCA(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	w.roots = x509.NewCertPool()
	w.roots.AddCert(w.upCA.Certificate())
	w.setPolicy(pol)

	w.names["allowed.test"] = []netip.Addr{ipAllowed}
	w.names["evil.test"] = []netip.Addr{ipEvil}
	w.names["api.test"] = []netip.Addr{ipAPI}
	w.names["other.test"] = []netip.Addr{ipOther}
	w.names["metadata.test"] = []netip.Addr{netip.MustParseAddr("169.254.169.254")}
	w.names["private.test"] = []netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("127.0.0.1")}
	w.names["mixed.test"] = []netip.Addr{netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("10.0.0.1"), ipAllowed}
	for name, ip := range map[string]netip.Addr{"allowed": ipAllowed, "evil": ipEvil, "api": ipAPI, "other": ipOther} {
		w.addHTTPServers(name, ip)
	}
	w.addBannerServer(netip.AddrPortFrom(ipSrvFirst, 25))

	cfg := Config{
		Lookup: func(src netip.Addr) (string, *netpolicy.Compiled, bool) {
			if src != netip.MustParseAddr("127.0.0.1") {
				return "", nil, false
			}
			return "sb1", w.pol.Load(), true
		},
		OriginalDst:   w.orig.lookup,
		Dial:          w.dial,
		LookupIP:      w.lookupIP,
		CA:            w.hutchCA,
		UpstreamRoots: w.roots,
		Log:           func(d Decision) { w.decisions <- d },
	}
	for _, f := range tweak {
		f(&cfg)
	}
	w.start(cfg)
	return w
}

func (w *world) setPolicy(p netpolicy.Policy) {
	c, err := netpolicy.Compile(p)
	if err != nil {
		w.t.Fatal(err)
	}
	w.pol.Store(c)
}

// echoHandler answers with the server's identity and what it received.
func echoHandler(ident string) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ws" {
			upgradeEcho(rw, r)
			return
		}
		auth := r.Header.Values("Authorization")
		if r.URL.Path == "/hints" {
			// 103 Early Hints go to the client before ModifyResponse runs.
			rw.Header().Set("Link", fmt.Sprintf("</style.css>; auth=%q", auth))
			rw.Header().Set("X-Hint", "ok")
			rw.WriteHeader(http.StatusEarlyHints)
			rw.Header().Del("Link")
			rw.Header().Del("X-Hint")
		}
		rw.Header().Set("X-Server", ident)
		rw.Header().Set("X-Echo-Auth", fmt.Sprint(auth))
		rw.Header().Set("Set-Cookie", "session="+r.Header.Get("X-Api-Key"))
		rw.Header().Set("Trailer", "X-Trailer-Auth, X-Trailer-Safe")
		fmt.Fprintf(rw, "server=%s host=%s auth=%q key=%q", ident, r.Host, auth, r.Header.Values("X-Api-Key"))
		rw.Header().Set("X-Trailer-Auth", fmt.Sprint(auth))
		rw.Header().Set("X-Trailer-Safe", "ok")
	})
}

// upgradeEcho switches protocols if the request carries the test
// credential (and tries to leak it in the 101's headers), then echoes one
// line.
func upgradeEcho(rw http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != secretAuth {
		http.Error(rw, "no credential", http.StatusUnauthorized)
		return
	}
	conn, brw, err := http.NewResponseController(rw).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	io.WriteString(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Leak: "+secretAuth+"\r\n\r\n")
	brw.Flush()
	line, _ := brw.ReadString('\n')
	io.WriteString(conn, "echo "+line)
}

func (w *world) addHTTPServers(ident string, ip netip.Addr) {
	tlsSrv := httptest.NewUnstartedServer(echoHandler(ident))
	tlsSrv.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		return w.upCA.Leaf(h.ServerName)
	}}
	tlsSrv.Config.ErrorLog = discardLog // refused handshakes are the point of many tests
	tlsSrv.StartTLS()
	w.t.Cleanup(tlsSrv.Close)
	plain := httptest.NewServer(echoHandler(ident))
	w.t.Cleanup(plain.Close)
	w.backends[netip.AddrPortFrom(ip, 443)] = tlsSrv.Listener.Addr().String()
	w.backends[netip.AddrPortFrom(ip, 80)] = plain.Listener.Addr().String()
}

// addBannerServer is a server that speaks first (like SMTP) and then
// echoes.
func (w *world) addBannerServer(at netip.AddrPort) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		w.t.Fatal(err)
	}
	var wg sync.WaitGroup
	w.t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				io.WriteString(c, "220 banner\r\n")
				io.Copy(c, c)
			})
		}
	})
	w.backends[at] = ln.Addr().String()
}

func (w *world) start(cfg Config) {
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		w.t.Fatal(err)
	}
	dnsTCP, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		w.t.Fatal(err)
	}
	dnsUDP, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		w.t.Fatal(err)
	}
	w.proxyAddr, w.dnsTCP, w.dnsUDP = ln.Addr().String(), dnsTCP.Addr().String(), dnsUDP.LocalAddr().String()
	w.served = make(chan error, 3)
	p, r := NewProxy(cfg), NewResolver(cfg)
	w.proxy = p
	go func() { w.served <- p.Serve(ctx, ln) }()
	go func() { w.served <- r.ServeTCP(ctx, dnsTCP) }()
	go func() { w.served <- r.ServeUDP(ctx, dnsUDP) }()
	w.t.Cleanup(w.stop)
}

// stop ends the proxy and resolver and checks that they return nil.
func (w *world) stop() {
	if w.cancel == nil {
		return
	}
	w.cancel()
	w.cancel = nil
	for range 3 {
		select {
		case err := <-w.served:
			if err != nil {
				w.t.Errorf("serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			w.t.Fatal("Serve did not return after its context ended")
		}
	}
}

func (w *world) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("test dial %q: not an IP literal", addr)
	}
	n, _ := w.dials.LoadOrStore(addr, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
	real, ok := w.backends[ap]
	if !ok {
		return nil, fmt.Errorf("test dial %s: no such server", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, real)
}

func (w *world) dialCount(ap netip.AddrPort) int64 {
	n, ok := w.dials.Load(ap.String())
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

func (w *world) lookupIP(_ context.Context, host string) ([]netip.Addr, error) {
	n, _ := w.lookups.LoadOrStore(host, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
	ips, ok := w.names[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return ips, nil
}

func (w *world) lookupCount(host string) int64 {
	n, ok := w.lookups.Load(host)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

// connect opens a connection to the proxy as if the sandbox had connected
// to orig.
func (w *world) connect(orig netip.AddrPort) net.Conn {
	w.t.Helper()
	c, err := net.Dial("tcp", w.proxyAddr)
	if err != nil {
		w.t.Fatal(err)
	}
	w.orig.set(c.LocalAddr().String(), orig)
	w.t.Cleanup(func() { c.Close() })
	return c
}

// client is an HTTP client inside the sandbox: it resolves names as the
// sandbox would (the fake names), or sends every connection to spoof if
// set, and trusts the upstream CA and hutch's CA.
func (w *world) client(spoof netip.AddrPort) *http.Client {
	roots := w.roots.Clone()
	roots.AddCert(w.hutchCA.Certificate())
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			orig := spoof
			if !orig.IsValid() {
				host, port, _ := net.SplitHostPort(addr)
				ips := w.names[host]
				if len(ips) == 0 {
					return nil, fmt.Errorf("no such host %s", host)
				}
				ap, err := netip.ParseAddrPort(net.JoinHostPort(ips[0].String(), port))
				if err != nil {
					return nil, err
				}
				orig = ap
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", w.proxyAddr)
			if err != nil {
				return nil, err
			}
			w.orig.set(c.LocalAddr().String(), orig)
			return c, nil
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		DisableKeepAlives: true,
	}
	w.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func (w *world) get(c *http.Client, url string, hdr ...string) (*http.Response, string, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// decision waits for the next logged decision matching pred.
func (w *world) decision(pred func(Decision) bool) Decision {
	w.t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case d := <-w.decisions:
			if pred(d) {
				return d
			}
		case <-timeout:
			w.t.Fatal("no matching decision logged")
			return Decision{}
		}
	}
}

// origMap is the fake SO_ORIGINAL_DST: the test client records where it
// meant to connect under its local address. The proxy may look before the
// client has recorded it, so a lookup waits for the record.
type origMap struct {
	mu      sync.Mutex
	m       map[string]netip.AddrPort
	waiters map[string]chan struct{}
}

func (o *origMap) set(local string, orig netip.AddrPort) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.m[local] = orig
	if ch, ok := o.waiters[local]; ok {
		close(ch)
		delete(o.waiters, local)
	}
}

func (o *origMap) lookup(c net.Conn) (netip.AddrPort, error) {
	key := c.RemoteAddr().String()
	o.mu.Lock()
	ap, ok := o.m[key]
	if ok {
		delete(o.m, key) // local ports are reused
		o.mu.Unlock()
		return ap, nil
	}
	ch, ok := o.waiters[key]
	if !ok {
		ch = make(chan struct{})
		o.waiters[key] = ch
	}
	o.mu.Unlock()
	select {
	case <-ch:
	case <-time.After(2 * time.Second):
		return netip.AddrPort{}, errors.New("no original destination recorded")
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	ap = o.m[key]
	delete(o.m, key)
	return ap, nil
}

func allowList(hosts ...string) netpolicy.Policy {
	p := netpolicy.Policy{Mode: netpolicy.AllowList}
	for _, h := range hosts {
		p.Allow = append(p.Allow, netpolicy.Rule{Host: h})
	}
	return p
}
