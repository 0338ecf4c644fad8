package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"strings"
	"testing"

	"github.com/hutch-dev/hutch/internal/netpolicy"
)

const (
	secretAuth = "Bearer s3cret-token"
	secretKey  = "k3y-value"
	otherAuth  = "Bearer other-secret"
)

func credPolicy() netpolicy.Policy {
	p := allowList("api.test", "other.test", "allowed.test")
	p.Credentials = []netpolicy.Credential{
		{Host: "api.test", Headers: map[string]string{"Authorization": secretAuth, "X-Api-Key": secretKey}},
		{Host: "other.test", Headers: map[string]string{"Authorization": otherAuth}},
	}
	return p
}

// The credential arrives upstream, replacing (not adding to) what the
// sandbox sent, and no response header or trailer gives it back.
func TestCredentialInjection(t *testing.T) {
	t.Parallel()
	w := newWorld(t, credPolicy())
	c := w.client(netip.AddrPort{})
	for _, url := range []string{"https://api.test/v1", "http://api.test/v1"} {
		resp, body, err := w.get(c, url, "Authorization", "Bearer fake", "Authorization", "Bearer fake2", "Connection", "X-Api-Key")
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		wantBody := fmt.Sprintf("server=api host=api.test auth=%q key=%q", []string{secretAuth}, []string{secretKey})
		if resp.StatusCode != 200 || body != wantBody {
			t.Errorf("%s: %d %q\nwant %q", url, resp.StatusCode, body, wantBody)
		}
		if resp.Header.Get("X-Server") != "api" {
			t.Errorf("%s: headers %v", url, resp.Header)
		}
		for k, vs := range resp.Header {
			for _, v := range vs {
				if strings.Contains(v, "s3cret") || strings.Contains(v, secretKey) {
					t.Errorf("%s: response header %s: %q carries a secret", url, k, v)
				}
			}
		}
		if resp.Trailer.Get("X-Trailer-Safe") != "ok" || resp.Trailer.Get("X-Trailer-Auth") != "" {
			t.Errorf("%s: trailers %v: want X-Trailer-Safe only", url, resp.Trailer)
		}
	}
	// 103 Early Hints: forwarded, minus the header carrying the secret.
	var hints []http.Header
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		hints = append(hints, http.Header(h))
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", "https://api.test/hints", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if len(hints) != 1 || hints[0].Get("X-Hint") != "ok" || hints[0].Get("Link") != "" {
		t.Errorf("early hints %v: want X-Hint without Link", hints)
	}
	if resp, _, _ := w.get(c, "https://api.test/"); resp == nil || resp.TLS == nil ||
		resp.TLS.PeerCertificates[0].Issuer.CommonName != w.hutchCA.Certificate().Subject.CommonName {
		t.Error("the intercepted connection was not served with a leaf of hutch's CA")
	}
	d := w.decision(func(d Decision) bool { return d.Host == "api.test" && d.Proto == "tls" })
	if !d.Allowed || !d.Intercepted || d.IP != ipAPI {
		t.Errorf("decision %+v", d)
	}
}

// A request on a connection intercepted for one host that names another
// host gets a 421 and no one's credentials travel.
func TestCredentialsNotSentToAnotherHost(t *testing.T) {
	t.Parallel()
	w := newWorld(t, credPolicy())
	roots := w.roots.Clone()
	roots.AddCert(w.hutchCA.Certificate())
	for _, host := range []string{"other.test", "allowed.test", "evil.test", "api.test.evil.test"} {
		tc := tls.Client(w.connect(netip.AddrPortFrom(ipAPI, 443)), &tls.Config{ServerName: "api.test", RootCAs: roots})
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\nGET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		br := bufio.NewReader(tc)
		for i, want := range []int{200, http.StatusMisdirectedRequest} {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("Host %s, request %d: %v", host, i+1, err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != want || (i == 1 && strings.Contains(string(b), "server=")) {
				t.Errorf("Host %s, request %d: %d %q", host, i+1, resp.StatusCode, b)
			}
		}
		tc.Close()
	}
	for _, ip := range []netip.Addr{ipOther, ipAllowed, ipEvil} {
		if n := w.dialCount(netip.AddrPortFrom(ip, 443)); n != 0 {
			t.Errorf("%v dialed %d times from an intercepted connection", ip, n)
		}
	}
	// The same over plain HTTP.
	conn := w.connect(netip.AddrPortFrom(ipAPI, 80))
	io.WriteString(conn, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
	br := bufio.NewReader(conn)
	for i, want := range []int{200, http.StatusMisdirectedRequest} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != want {
			t.Fatalf("plain request %d: %v %v", i+1, resp, err)
		}
		io.ReadAll(resp.Body)
	}
	if n := w.dialCount(netip.AddrPortFrom(ipOther, 80)); n != 0 {
		t.Errorf("other.test:80 dialed %d times", n)
	}
}

// An intercepted host whose certificate the proxy cannot verify gets a
// 502, never an unverified connection carrying the credentials.
func TestInterceptVerifiesUpstream(t *testing.T) {
	t.Parallel()
	w := newWorld(t, credPolicy(), func(c *Config) { c.UpstreamRoots = nil }) // system roots: the test CA is unknown
	resp, body, err := w.get(w.client(netip.AddrPort{}), "https://api.test/")
	if err != nil || resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "not trusted") {
		t.Errorf("%v %v %q", resp, err, body)
	}
}

// A WebSocket-style upgrade passes through an intercepted connection.
func TestInterceptUpgrade(t *testing.T) {
	t.Parallel()
	w := newWorld(t, credPolicy())
	roots := w.roots.Clone()
	roots.AddCert(w.hutchCA.Certificate())
	tc := tls.Client(w.connect(netip.AddrPortFrom(ipAPI, 443)), &tls.Config{ServerName: "api.test", RootCAs: roots})
	io.WriteString(tc, "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	br := bufio.NewReader(tc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("%v %v", resp, err)
	}
	if v := resp.Header.Get("X-Leak"); v != "" {
		t.Errorf("the upgrade response carried a secret: %q", v)
	}
	io.WriteString(tc, "hello\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo hello\n" {
		t.Errorf("after the upgrade: %q %v", line, err)
	}
}

// Without a CA the proxy refuses a host with credential rules rather than
// letting it through without them.
func TestInterceptWithoutCARefuses(t *testing.T) {
	t.Parallel()
	w := newWorld(t, credPolicy(), func(c *Config) { c.CA = nil })
	if _, _, err := w.get(w.client(netip.AddrPort{}), "https://api.test/"); err == nil {
		t.Error("a credential host was reached without interception")
	}
	if n := w.dialCount(netip.AddrPortFrom(ipAPI, 443)); n != 0 {
		t.Errorf("dialed %d times", n)
	}
}
