package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/netpolicy"
)

func TestAllowedNameTLSAndHTTP(t *testing.T) {
	t.Parallel()
	w := newWorld(t, allowList("allowed.test"))
	c := w.client(netip.AddrPort{})
	for _, url := range []string{"https://allowed.test/x", "http://allowed.test/x"} {
		resp, body, err := w.get(c, url)
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		if resp.StatusCode != 200 || !strings.HasPrefix(body, "server=allowed") {
			t.Fatalf("%s: %d %q", url, resp.StatusCode, body)
		}
		d := w.decision(func(d Decision) bool { return d.Host == "allowed.test" })
		if !d.Allowed || d.Sandbox != "sb1" || d.IP != ipAllowed || d.BytesUp == 0 || d.BytesDown == 0 {
			t.Errorf("%s: decision %+v", url, d)
		}
		if want := map[bool]string{true: "tls", false: "http"}[strings.HasPrefix(url, "https")]; d.Proto != want {
			t.Errorf("%s: proto %q, want %q", url, d.Proto, want)
		}
	}
}

func TestNameNotAllowed(t *testing.T) {
	t.Parallel()
	w := newWorld(t, allowList("allowed.test"))
	c := w.client(netip.AddrPort{})
	if _, _, err := w.get(c, "https://evil.test/"); err == nil {
		t.Error("TLS to a name not allowed succeeded")
	}
	d := w.decision(func(d Decision) bool { return d.Host == "evil.test" })
	if d.Allowed || d.Proto != "tls" {
		t.Errorf("decision %+v", d)
	}
	resp, body, err := w.get(c, "http://evil.test/")
	if err != nil || resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "not allowed") {
		t.Errorf("plain HTTP to a name not allowed: %v %v %q", resp, err, body)
	}
	// A port the host rule does not name.
	if _, _, err := w.get(c, "https://allowed.test:8443/"); err == nil {
		t.Error("an allowed name on a port its rule does not name succeeded")
	}
	for _, ip := range []netip.Addr{ipEvil, ipAllowed} {
		for _, port := range []uint16{80, 443, 8443} {
			if n := w.dialCount(netip.AddrPortFrom(ip, port)); n != 0 {
				t.Errorf("%v:%d dialed %d times", ip, port, n)
			}
		}
	}
	if w.lookupCount("evil.test") != 0 {
		t.Error("the proxy resolved a name the policy does not allow")
	}
}

// An SNI naming an allowed host while the sandbox connected to another
// server reaches the allowed host only: the proxy dials the name.
func TestSNISpoofing(t *testing.T) {
	t.Parallel()
	w := newWorld(t, allowList("allowed.test"))
	c := w.client(netip.AddrPortFrom(ipEvil, 443))
	resp, body, err := w.get(c, "https://allowed.test/")
	if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(body, "server=allowed") {
		t.Fatalf("%v %q", err, body)
	}
	if n := w.dialCount(netip.AddrPortFrom(ipEvil, 443)); n != 0 {
		t.Errorf("the spoofed destination was dialed %d times", n)
	}
	// Raw: a ClientHello for allowed.test sent toward evil.test's address
	// by a client that trusts anything ends up at allowed.test's server.
	conn := w.connect(netip.AddrPortFrom(ipEvil, 443))
	tc := tls.Client(conn, &tls.Config{ServerName: "allowed.test", InsecureSkipVerify: true})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if cn := tc.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "allowed.test" {
		t.Errorf("reached a server presenting %q", cn)
	}
}

func TestHostSpoofing(t *testing.T) {
	t.Parallel()
	w := newWorld(t, allowList("allowed.test"))
	c := w.client(netip.AddrPortFrom(ipEvil, 80))
	resp, body, err := w.get(c, "http://allowed.test/")
	if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(body, "server=allowed") {
		t.Fatalf("%v %q", err, body)
	}
	// A second request on the same connection naming another host is
	// answered 421, not forwarded (to either server).
	conn := w.connect(netip.AddrPortFrom(ipEvil, 80))
	io.WriteString(conn, "GET /1 HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET /2 HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	br := bufio.NewReader(conn)
	for i, want := range []int{200, http.StatusMisdirectedRequest} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Errorf("request %d: %d %q", i+1, resp.StatusCode, b)
		}
	}
	// Absolute-form targets name the host the same way.
	conn = w.connect(netip.AddrPortFrom(ipAllowed, 80))
	io.WriteString(conn, "GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	resp, err = http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("absolute-form target for another host: %v %v", resp, err)
	}
	if n := w.dialCount(netip.AddrPortFrom(ipEvil, 80)); n != 0 {
		t.Errorf("the spoofed destination was dialed %d times", n)
	}
}

// A connection to an allowed name's address without the name (no SNI, no
// Host, or not TLS/HTTP at all) is refused.
func TestDirectIPRefused(t *testing.T) {
	t.Parallel()
	w := newWorld(t, allowList("allowed.test"), func(c *Config) { c.PeekTimeout = 300 * time.Millisecond })
	to := netip.AddrPortFrom(ipAllowed, 443)
	tc := tls.Client(w.connect(to), &tls.Config{InsecureSkipVerify: true}) // no ServerName: no SNI
	if err := tc.Handshake(); err == nil {
		t.Error("TLS without SNI to an allowed name's address succeeded")
	}
	for _, send := range []string{"SSH-2.0-x\r\n", "GET / HTTP/1.0\r\n\r\n", ""} {
		conn := w.connect(to)
		io.WriteString(conn, send)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(conn)
		if len(b) > 0 && !strings.HasPrefix(string(b), "HTTP/1.1 403") {
			t.Errorf("sent %q, got %q", send, b)
		}
	}
	if n := w.dialCount(to); n != 0 {
		t.Errorf("dialed %d times", n)
	}
	d := w.decision(func(d Decision) bool { return d.Host == "" })
	if d.Allowed || d.IP != ipAllowed || d.Port != 443 {
		t.Errorf("decision %+v", d)
	}
}

// An allowed name that resolves to the metadata address, a private range
// or loopback is not dialed.
func TestAllowedNameResolvingToDeniedRange(t *testing.T) {
	t.Parallel()
	w := newWorld(t, allowList("metadata.test", "private.test"))
	c := w.client(netip.AddrPortFrom(ipAllowed, 443))
	for _, url := range []string{"https://metadata.test/", "http://metadata.test/", "https://private.test/", "http://private.test/"} {
		resp, _, err := w.get(c, url)
		if err == nil && resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d", url, resp.StatusCode)
		}
	}
	w.dials.Range(func(k, _ any) bool {
		t.Errorf("dialed %v", k)
		return true
	})
	d := w.decision(func(d Decision) bool { return d.Host == "metadata.test" })
	if d.Allowed {
		t.Errorf("decision %+v", d)
	}

	// A name with denied and allowed addresses: only the allowed one is
	// dialed.
	w.setPolicy(allowList("mixed.test"))
	if _, body, err := w.get(c, "https://mixed.test/"); err != nil || !strings.HasPrefix(body, "server=allowed") {
		t.Errorf("mixed.test: %v %q", err, body)
	}
	w.dials.Range(func(k, _ any) bool {
		if k != netip.AddrPortFrom(ipAllowed, 443).String() {
			t.Errorf("dialed %v", k)
		}
		return true
	})
	w.dials.Clear()

	// Allow-all: the sandbox got the same denied address from DNS, so the
	// original destination is denied too.
	w.setPolicy(netpolicy.Policy{Mode: netpolicy.AllowAll})
	c = w.client(netip.MustParseAddrPort("169.254.169.254:80"))
	if resp, _, err := w.get(c, "http://metadata.test/latest/meta-data/"); err == nil && resp.StatusCode != http.StatusForbidden {
		t.Errorf("allow-all reached the metadata name: %d", resp.StatusCode)
	}
	w.dials.Range(func(k, _ any) bool {
		t.Errorf("dialed %v", k)
		return true
	})
	// If the original address is itself allowed, a name that reaches no
	// allowed address falls back to it (no more than sending no name).
	c = w.client(netip.AddrPortFrom(ipAllowed, 443))
	if _, body, err := w.get(c, "https://private.test/"); err != nil || !strings.HasPrefix(body, "server=allowed") {
		t.Errorf("fallback to an allowed original address: %v %q", err, body)
	}
	w.dials.Range(func(k, _ any) bool {
		if k != netip.AddrPortFrom(ipAllowed, 443).String() {
			t.Errorf("dialed %v", k)
		}
		return true
	})
}

func TestLivePolicySwap(t *testing.T) {
	t.Parallel()
	w := newWorld(t, allowList("allowed.test"))
	c := w.client(netip.AddrPort{})
	if _, _, err := w.get(c, "https://allowed.test/"); err != nil {
		t.Fatal(err)
	}
	w.setPolicy(allowList("evil.test"))
	if _, _, err := w.get(c, "https://allowed.test/"); err == nil {
		t.Error("the old policy still applied to a new connection")
	}
	if resp, _, err := w.get(c, "https://evil.test/"); err != nil || resp.StatusCode != 200 {
		t.Errorf("the new policy did not apply: %v", err)
	}
	w.setPolicy(netpolicy.Policy{Mode: netpolicy.DenyAll})
	if _, _, err := w.get(c, "https://evil.test/"); err == nil {
		t.Error("deny-all let a connection out")
	}
}

// An address admitted by a CIDR rule goes out without a name, and a
// server that speaks first does not wait for the peek deadline.
func TestServerSpeaksFirst(t *testing.T) {
	t.Parallel()
	pol := netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{CIDR: ipSrvFirst.String(), Ports: []int{25}}}}
	to := netip.AddrPortFrom(ipSrvFirst, 25)
	readBanner := func(w *world) time.Duration {
		start := time.Now()
		conn := w.connect(to)
		defer conn.Close() // the decision is logged when the connection ends
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil || line != "220 banner\r\n" {
			t.Fatalf("banner: %q %v", line, err)
		}
		return time.Since(start)
	}
	w := newWorld(t, pol, func(c *Config) { c.PeekTimeout = 2 * time.Second })
	if took := readBanner(w); took > time.Second {
		t.Errorf("a server-first connection to an allowed address took %v", took)
	}
	if d := w.decision(func(Decision) bool { return true }); !d.Allowed || d.Reason != "address allowed" {
		t.Errorf("decision %+v", d)
	}
	// With credential rules a name could need interception, so the proxy
	// waits the full peek deadline, then still lets the admitted address
	// through.
	pol.Credentials = []netpolicy.Credential{{Host: "api.test", Headers: map[string]string{"Authorization": "x"}}}
	w2 := newWorld(t, pol, func(c *Config) { c.PeekTimeout = 300 * time.Millisecond })
	if took := readBanner(w2); took < 300*time.Millisecond {
		t.Errorf("did not wait for a name: %v", took)
	}
	// Not admitted: closed.
	w.setPolicy(allowList("allowed.test"))
	conn := w.connect(to)
	conn.SetReadDeadline(time.Now().Add(8 * time.Second))
	if b, _ := io.ReadAll(conn); len(b) != 0 {
		t.Errorf("got %q from an address the policy does not admit", b)
	}
}

func TestUnknownSourceRefused(t *testing.T) {
	t.Parallel()
	w := newWorld(t, netpolicy.Policy{Mode: netpolicy.AllowAll}, func(c *Config) {
		c.Lookup = func(netip.Addr) (string, *netpolicy.Compiled, bool) { return "", nil, false }
	})
	conn := w.connect(netip.AddrPortFrom(ipAllowed, 80))
	io.WriteString(conn, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, _ := io.ReadAll(conn); len(b) != 0 {
		t.Errorf("got %q", b)
	}
	if d := w.decision(func(Decision) bool { return true }); d.Allowed || d.Reason != "unknown source address" {
		t.Errorf("decision %+v", d)
	}
}

// Serve ends, and closes the connections it handles, when its context
// ends.
func TestServeStopsWithContext(t *testing.T) {
	t.Parallel()
	pol := netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{CIDR: ipSrvFirst.String()}, {Host: "api.test"}},
		Credentials: []netpolicy.Credential{{Host: "api.test", Headers: map[string]string{"Authorization": "x"}}}}
	w := newWorld(t, pol, func(c *Config) { c.PeekTimeout = 100 * time.Millisecond })
	spliced := w.connect(netip.AddrPortFrom(ipSrvFirst, 25))
	br := bufio.NewReader(spliced)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	// An intercepted keep-alive connection, idle between requests.
	roots := w.roots.Clone()
	roots.AddCert(w.hutchCA.Certificate())
	tc := tls.Client(w.connect(netip.AddrPortFrom(ipAPI, 443)), &tls.Config{ServerName: "api.test", RootCAs: roots})
	io.WriteString(tc, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
	tbr := bufio.NewReader(tc)
	resp, err := http.ReadResponse(tbr, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	idle := w.connect(netip.AddrPortFrom(ipAllowed, 443)) // still peeking

	start := time.Now()
	w.stop()
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Serve took %v to return", took)
	}
	for name, r := range map[string]io.Reader{"spliced": br, "intercepted": tbr, "peeking": idle} {
		if c, ok := r.(net.Conn); ok {
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
		}
		spliced.SetReadDeadline(time.Now().Add(2 * time.Second))
		tc.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := r.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Errorf("%s connection still open after Serve returned: %v", name, err)
		}
	}
	// A new connection is refused: the listener is closed.
	if c, err := net.DialTimeout("tcp", w.proxyAddr, time.Second); err == nil {
		c.Close()
		t.Error("the listener still accepts")
	}
}

func TestServeNeedsLookup(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := NewProxy(Config{}).Serve(context.Background(), ln); err == nil {
		t.Error("Serve without Lookup succeeded")
	}
}

// The default dialer checks the address once more in its Control hook,
// right before connect: an address the policy does not let the proxy dial
// is never connected to, even if a caller skipped the check.
func TestDefaultDialerChecksBeforeConnect(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- struct{}{}
			c.Close()
		}
	}()
	target := netip.MustParseAddrPort(ln.Addr().String())
	p := NewProxy(Config{Lookup: func(netip.Addr) (string, *netpolicy.Compiled, bool) { return "", nil, false }})
	allowAll, _ := netpolicy.Compile(netpolicy.Policy{Mode: netpolicy.AllowAll})
	if c, err := p.dialIP(context.Background(), allowAll, target.Addr(), int(target.Port()), nil); err == nil {
		c.Close()
		t.Fatal("dialed loopback under allow-all")
	} else if !errors.Is(err, errRefused) {
		t.Errorf("err = %v, want a refusal", err)
	}
	select {
	case <-accepted:
		t.Fatal("the refused dial reached the listener")
	case <-time.After(100 * time.Millisecond):
	}
	// A CIDR rule naming the address admits it.
	named, _ := netpolicy.Compile(netpolicy.Policy{Mode: netpolicy.AllowList,
		Allow: []netpolicy.Rule{{CIDR: "127.0.0.1", Ports: []int{int(target.Port())}}}})
	c, err := p.dialIP(context.Background(), named, target.Addr(), int(target.Port()), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	<-accepted
}

// failingListener accepts one connection, then fails for good.
type failingListener struct {
	net.Listener
	accepted bool
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.accepted {
		return nil, errors.New("listener broke")
	}
	l.accepted = true
	return l.Listener.Accept()
}

// An accept error ends Serve, and the connections it was handling end
// with it rather than keeping Serve waiting.
func TestServeAcceptErrorEndsConnections(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	allowAll, _ := netpolicy.Compile(netpolicy.Policy{Mode: netpolicy.AllowAll})
	p := NewProxy(Config{
		Lookup: func(netip.Addr) (string, *netpolicy.Compiled, bool) { return "sb", allowAll, true },
		// A denied address: the proxy waits the whole PeekTimeout for a name.
		OriginalDst: func(net.Conn) (netip.AddrPort, error) { return netip.MustParseAddrPort("10.0.0.1:443"), nil },
		Dial: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("no dialing in this test")
		},
		PeekTimeout: time.Minute, // the client's silence would hold the connection
	})
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() { done <- p.Serve(context.Background(), &failingListener{Listener: ln}) }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Serve returned nil after an accept error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve kept waiting on its connection after an accept error")
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("the connection is still open: %v", err)
	}
}

// One sandbox cannot hold more than MaxConnsPerSandbox connections open
// through the proxy; closing one makes room again.
func TestConnectionCapPerSandbox(t *testing.T) {
	t.Parallel()
	pol := netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{CIDR: ipSrvFirst.String(), Ports: []int{25}}}}
	w := newWorld(t, pol, func(c *Config) { c.MaxConnsPerSandbox = 2 })
	to := netip.AddrPortFrom(ipSrvFirst, 25)
	banner := func(conn net.Conn) error {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := bufio.NewReader(conn).ReadString('\n')
		return err
	}
	a, b := w.connect(to), w.connect(to)
	if banner(a) != nil || banner(b) != nil {
		t.Fatal("the first two connections got no banner")
	}
	c := w.connect(to)
	if banner(c) == nil {
		t.Fatal("a third connection got through the cap")
	}
	if d := w.decision(func(d Decision) bool { return strings.HasPrefix(d.Reason, "over 2 open") }); d.Allowed {
		t.Errorf("decision %+v", d)
	}
	a.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		d := w.connect(to)
		err := banner(d)
		d.Close()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no room after a connection closed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Close()
	c.Close()
}

// A policy change closes the open connections the new policy refuses and
// leaves the others alone; a relayed (credential) connection goes when its
// credentials change.
func TestRevalidate(t *testing.T) {
	t.Parallel()
	pol := credPolicy()
	pol.Allow = append(pol.Allow, netpolicy.Rule{CIDR: ipSrvFirst.String(), Ports: []int{25}})
	// With credential rules a silent client waits the whole peek.
	w := newWorld(t, pol, func(c *Config) { c.PeekTimeout = 300 * time.Millisecond })

	banner := w.connect(netip.AddrPortFrom(ipSrvFirst, 25))
	banner.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(banner)
	if line, err := br.ReadString('\n'); err != nil || line != "220 banner\r\n" {
		t.Fatalf("banner: %q %v", line, err)
	}
	// A spliced TLS connection to an allowed name, kept open.
	raw := w.connect(netip.AddrPortFrom(ipAllowed, 443))
	tc := tls.Client(raw, &tls.Config{ServerName: "allowed.test", RootCAs: w.roots})
	get := func(c net.Conn, host string) error {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	if err := get(tc, "allowed.test"); err != nil {
		t.Fatal(err)
	}
	// A relayed connection with credentials (TLS terminated by hutch).
	roots := w.roots.Clone()
	roots.AddCert(w.hutchCA.Certificate())
	api := tls.Client(w.connect(netip.AddrPortFrom(ipAPI, 443)), &tls.Config{ServerName: "api.test", RootCAs: roots})
	if err := get(api, "api.test"); err != nil {
		t.Fatal(err)
	}

	// Nothing changes for these three: nothing closes.
	if n := w.proxy.Revalidate("sb1", w.pol.Load()); n != 0 {
		t.Fatalf("an unchanged policy closed %d connections", n)
	}
	// The CIDR goes and api.test's credential changes; allowed.test stays.
	next := credPolicy()
	next.Credentials[0].Headers["Authorization"] = "Bearer rotated"
	w.setPolicy(next)
	if n := w.proxy.Revalidate("sb1", w.pol.Load()); n != 2 {
		t.Fatalf("Revalidate closed %d connections, want 2 (the banner service and the relayed one)", n)
	}
	banner.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadString('\n'); err == nil {
		t.Fatal("the connection to a CIDR taken off the list is still open")
	}
	if err := get(api, "api.test"); err == nil {
		t.Fatal("the relayed connection outlived its credential's change")
	}
	if err := get(tc, "allowed.test"); err != nil {
		t.Fatalf("a connection the new policy still allows was closed: %v", err)
	}
	// Deny-all closes everything.
	w.setPolicy(netpolicy.Policy{Mode: netpolicy.DenyAll})
	if n := w.proxy.Revalidate("sb1", w.pol.Load()); n != 1 {
		t.Fatalf("deny-all closed %d connections, want 1", n)
	}
	if err := get(tc, "allowed.test"); err == nil {
		t.Fatal("a connection survived deny-all")
	}
}
