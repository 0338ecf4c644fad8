package hutch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/daemon"
	"github.com/hutch-dev/hutch/internal/daemon/daemontest"
	"github.com/hutch-dev/hutch/internal/netpolicy/gateway"
	"github.com/hutch-dev/hutch/internal/netpolicy/nettest"
	hutch "github.com/hutch-dev/hutch/sdk"
)

// TestNetworkOff runs the policy and port tests against a daemon without
// sandbox networking (daemontest's default): every sandbox is deny-all,
// and exposed ports still work, since the daemon dials them inside the
// sandbox's namespace.
func TestNetworkOff(t *testing.T) {
	d := daemontest.Start(t)
	sock, err := hutch.New("unix://"+d.Socket, "")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{d: d, sock: sock}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, *env)
	}{
		{"NoNetworking", testNoNetworking}, {"PolicyErrors", testPolicyErrors},
		{"Ports", testPorts}, {"PortAccess", testPortAccess},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.f(t, e)
		})
	}
}

// testNoNetworking: without networking, deny-all is all there is.
func testNoNetworking(t *testing.T, e *env) {
	ctx := ctxT(t)
	_, err := e.sock.Create(ctx, hutch.CreateOptions{Network: &hutch.NetworkPolicy{Mode: hutch.NetworkAllowAll}})
	wantErr(t, err, hutch.ErrFailedPrecondition, "failed_precondition")

	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	if sb.NetworkMode != hutch.NetworkDenyAll {
		t.Fatalf("a sandbox created without a policy is %q, want deny-all", sb.NetworkMode)
	}
	p, err := sb.Network(ctx)
	if err != nil || p.Mode != hutch.NetworkDenyAll || len(p.Allow)+len(p.Deny)+len(p.Credentials) != 0 {
		t.Fatalf("network: %+v %v", p, err)
	}
	_, err = sb.SetNetwork(ctx, hutch.NetworkPolicy{Mode: hutch.NetworkAllowList,
		Allow: []hutch.NetworkRule{{Host: "example.com"}}})
	wantErr(t, err, hutch.ErrFailedPrecondition, "failed_precondition")

	// deny-all with a deny list and credentials is accepted (nothing
	// leaves anyway), and shown normalized and redacted.
	p, err = sb.SetNetwork(ctx, hutch.NetworkPolicy{Mode: hutch.NetworkDenyAll, Deny: []string{"203.0.113.9"},
		Credentials: []hutch.NetworkCredential{{Host: "API.example.com", Headers: map[string]string{"X-Key": "off-secret"}}}})
	if err != nil || p.Mode != hutch.NetworkDenyAll || len(p.Deny) != 1 || p.Deny[0] != "203.0.113.9/32" ||
		len(p.Credentials) != 1 || p.Credentials[0].Host != "api.example.com" || p.Credentials[0].Headers["X-Key"] != hutch.RedactedValue {
		t.Fatalf("set deny-all: %+v %v", p, err)
	}
	evs, err := sb.NetworkEvents(ctx)
	if err != nil || len(evs) != 0 {
		t.Fatalf("events without networking: %+v %v", evs, err)
	}
}

// testPolicyErrors: a bad policy or a missing sandbox keeps the daemon's
// error class, whoever asks.
func testPolicyErrors(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	for _, p := range []hutch.NetworkPolicy{
		{Mode: "open"},
		{Mode: hutch.NetworkDenyAll, Deny: []string{"not-an-ip"}},
		{Mode: hutch.NetworkDenyAll, Allow: []hutch.NetworkRule{{Host: "a.example", CIDR: "10.0.0.0/8"}}},
		{Mode: hutch.NetworkDenyAll, Allow: []hutch.NetworkRule{{Host: "a.example", Ports: []int{0}}}},
		{Mode: hutch.NetworkDenyAll, Credentials: []hutch.NetworkCredential{{Host: "a.example"}}},
	} {
		_, err := sb.SetNetwork(ctx, p)
		wantErr(t, err, hutch.ErrInvalidArgument, "invalid_argument")
	}
	_, err := e.sock.Create(ctx, hutch.CreateOptions{Network: &hutch.NetworkPolicy{Mode: "open"}})
	wantErr(t, err, hutch.ErrInvalidArgument, "invalid_argument")

	_, err = e.sock.Network(ctx, "ghost")
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	_, err = e.sock.SetNetwork(ctx, "ghost", hutch.NetworkPolicy{})
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	_, err = e.sock.NetworkEvents(ctx, "ghost")
	wantErr(t, err, hutch.ErrNotFound, "not_found")

	// Another tenant's sandbox is missing, for policies and ports alike.
	other := e.tcpClient(t, "net-other")
	_, err = other.Network(ctx, sb.ID)
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	_, err = other.SetNetwork(ctx, sb.ID, hutch.NetworkPolicy{})
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	_, err = other.ExposePort(ctx, sb.ID, 8000, true)
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	_, err = other.Ports(ctx, sb.ID)
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	err = other.UnexposePort(ctx, sb.ID, 8000)
	wantErr(t, err, hutch.ErrNotFound, "not_found")
}

// startHTTPD serves dir on 127.0.0.1:8000 inside sb with busybox httpd.
func startHTTPD(t *testing.T, sb *hutch.Sandbox, body string) {
	t.Helper()
	ctx := ctxT(t)
	if err := sb.WriteFile(ctx, "www/index.html", []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.StartProcess(ctx, "exec busybox httpd -f -p 127.0.0.1:8000 -h /workspace/www", hutch.ProcessOptions{Tag: "httpd"}); err != nil {
		t.Fatal(err)
	}
}

// get fetches url with hc, retrying while the sandbox's server is not up
// yet (the daemon answers unavailable), and returns status and body.
func get(t *testing.T, hc *http.Client, url string, header http.Header) (int, string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		return resp.StatusCode, string(body)
	}
}

// errCode is the code of an API error body.
func errCode(body string) string {
	var e struct{ Code string }
	_ = json.Unmarshal([]byte(body), &e)
	return e.Code
}

// testPorts: expose, list, re-expose, unexpose, over the local socket.
func testPorts(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	startHTTPD(t, sb, "hello from the sandbox\n")

	ep, err := sb.ExposePort(ctx, 8000, false)
	if err != nil || ep.Port != 8000 || ep.Public || !strings.HasPrefix(ep.Token, "hpt_") ||
		ep.Path != "/v1/sandboxes/"+sb.ID+"/ports/8000/" || ep.URL != "" || ep.SandboxID != sb.ID {
		t.Fatalf("expose: %+v %v", ep, err)
	}
	hc, base := e.sock.PortClient(*ep)
	if base != "http://hutch"+ep.Path || e.sock.PortURL(*ep) != base {
		t.Fatalf("port base URL over the socket: %s", base)
	}
	if code, body := get(t, hc, base+"index.html", nil); code != 200 || body != "hello from the sandbox\n" {
		t.Fatalf("through the socket: %d %q", code, body)
	}
	if code, body := get(t, hc, base+"missing.html", nil); code != 404 || errCode(body) != "" {
		t.Fatalf("a 404 of the sandbox's server passes through as is: %d %q", code, body)
	}

	ports, err := sb.Ports(ctx)
	if err != nil || len(ports) != 1 || ports[0] != *ep {
		t.Fatalf("ports: %+v %v", ports, err)
	}
	again, err := e.sock.ExposePort(ctx, sb.ID, 8000, true)
	if err != nil || !again.Public || again.Token == ep.Token {
		t.Fatalf("expose again: %+v %v", again, err)
	}
	if _, err := sb.ExposePort(ctx, 9000, false); err != nil {
		t.Fatal(err)
	}
	if ports, err = e.sock.Ports(ctx, sb.ID); err != nil || len(ports) != 2 {
		t.Fatalf("ports: %+v %v", ports, err)
	}
	// A port exposed with nothing listening: the daemon says so.
	hc9, base9 := e.sock.PortClient(ports[1])
	if ports[1].Port != 9000 {
		hc9, base9 = e.sock.PortClient(ports[0])
	}
	resp, err := hc9.Get(base9)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || errCode(string(body)) != "unavailable" {
		t.Fatalf("a port nobody listens on: %d %s", resp.StatusCode, body)
	}

	for _, p := range []int{8000, 9000, 9000} { // unexposing twice is fine
		if err := sb.UnexposePort(ctx, p); err != nil {
			t.Fatalf("unexpose %d: %v", p, err)
		}
	}
	if ports, err = sb.Ports(ctx); err != nil || len(ports) != 0 {
		t.Fatalf("ports after unexpose: %+v %v", ports, err)
	}
	if code, body := get(t, hc, base+"index.html", nil); code != 404 || errCode(body) != "not_found" {
		t.Fatalf("an unexposed port: %d %q", code, body)
	}

	// Port 0 is every port without a setting of its own (as E2B's are).
	all, err := sb.ExposePort(ctx, 0, false)
	if err != nil || all.Port != 0 || all.Token == "" {
		t.Fatalf("expose every port: %+v %v", all, err)
	}
	url := "http://" + e.d.TCPAddr + ep.Path + "index.html"
	if code, body := get(t, http.DefaultClient, url, nil); code != 401 {
		t.Fatalf("every port, no token: %d %q", code, body)
	}
	if code, body := get(t, http.DefaultClient, url, http.Header{"X-Hutch-Port-Token": {all.Token}}); code != 200 {
		t.Fatalf("every port, its token: %d %q", code, body)
	}
	if err := sb.UnexposePort(ctx, 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{-1, 65536} {
		_, err := sb.ExposePort(ctx, p, false)
		wantErr(t, err, hutch.ErrInvalidArgument, "invalid_argument")
	}
	_, err = e.sock.ExposePort(ctx, "ghost", 8000, false)
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	_, err = e.sock.Ports(ctx, "ghost")
	wantErr(t, err, hutch.ErrNotFound, "not_found")
}

// testPortAccess: over TCP a port needs its token, a key of the sandbox's
// tenant, or to be public; the helper's client sends the token.
func testPortAccess(t *testing.T, e *env) {
	ctx := ctxT(t)
	owner := e.tcpClient(t, "net-owner")
	sb := sandbox(t, owner, hutch.CreateOptions{})
	startHTTPD(t, sb, "over tcp\n")
	ep, err := sb.ExposePort(ctx, 8000, false)
	if err != nil {
		t.Fatal(err)
	}
	hc, base := owner.PortClient(*ep)
	if base != "http://"+e.d.TCPAddr+ep.Path {
		t.Fatalf("port base URL over TCP: %s", base)
	}
	if code, body := get(t, hc, base+"index.html", nil); code != 200 || body != "over tcp\n" {
		t.Fatalf("with the helper: %d %q", code, body)
	}
	// The query parameter works too, for clients that cannot set headers.
	if code, body := get(t, http.DefaultClient, base+"index.html?hutch_port_token="+ep.Token, nil); code != 200 || body != "over tcp\n" {
		t.Fatalf("with the token in the query: %d %q", code, body)
	}
	if code, body := get(t, http.DefaultClient, base+"index.html", nil); code != 401 || errCode(body) != "unauthenticated" {
		t.Fatalf("without a token: %d %q", code, body)
	}
	if code, body := get(t, http.DefaultClient, base+"index.html", http.Header{hutch.PortTokenHeader: {"hpt_wrong"}}); code != 403 || errCode(body) != "permission_denied" {
		t.Fatalf("with a wrong token: %d %q", code, body)
	}
	// Another tenant's key opens nothing, but the helper of another
	// tenant's client still carries the token it was handed.
	other := e.tcpClient(t, "net-stranger")
	_, err = other.Ports(ctx, sb.ID)
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	ohc, obase := other.PortClient(*ep)
	if code, body := get(t, ohc, obase+"index.html", nil); code != 200 || body != "over tcp\n" {
		t.Fatalf("the token through another tenant's client: %d %q", code, body)
	}

	// A public port needs nothing; a token from before re-exposing is stale.
	pub, err := owner.ExposePort(ctx, sb.ID, 8000, true)
	if err != nil || !pub.Public {
		t.Fatalf("expose public: %+v %v", pub, err)
	}
	if code, body := get(t, http.DefaultClient, base+"index.html", nil); code != 200 || body != "over tcp\n" {
		t.Fatalf("a public port: %d %q", code, body)
	}
	if _, err := owner.ExposePort(ctx, sb.ID, 8000, false); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, hc, base+"index.html", nil); code != 403 || errCode(body) != "permission_denied" {
		t.Fatalf("a stale token: %d %q", code, body)
	}
}

// TestNetworkOn sets policies through the SDK on a daemon with networking
// whose outbound connections go to a test internet (internal/netpolicy/
// nettest), and checks they are what the sandbox gets.
func TestNetworkOn(t *testing.T) {
	nettest.NeedNetworking(t)
	in := nettest.Start(t)
	if _, err := os.Stat("/usr/bin/curl"); err != nil {
		t.Skip("the test runs curl in the sandbox (from the host base): apt-get install curl")
	}
	d := daemontest.Start(t, func(c *daemon.Config) {
		c.Network = &gateway.Options{EgressNetNS: in.Path(), DNSUpstream: nettest.DNSAddr.String(), UpstreamRoots: in.CAPool}
	})
	c, err := hutch.New("unix://"+d.Socket, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	const secret = "Bearer sdk-secret-4f1c"
	sb := sandbox(t, c, hutch.CreateOptions{Network: &hutch.NetworkPolicy{Mode: hutch.NetworkAllowList,
		Allow: []hutch.NetworkRule{{Host: "WWW.test"}, {CIDR: "198.18.0.0/24", Ports: []int{9, 7, 7}}},
		Deny:  []string{"198.18.0.12"},
		Credentials: []hutch.NetworkCredential{{Host: "www.test",
			Headers: map[string]string{"Authorization": secret}}}}})
	if sb.NetworkMode != hutch.NetworkAllowList {
		t.Fatalf("network mode: %q", sb.NetworkMode)
	}

	// The policy comes back normalized, its credential value redacted, and
	// the value is in no answer.
	p, err := sb.Network(ctx)
	want := hutch.NetworkPolicy{Mode: hutch.NetworkAllowList,
		Allow: []hutch.NetworkRule{{Host: "www.test"}, {CIDR: "198.18.0.0/24", Ports: []int{7, 9}}},
		Deny:  []string{"198.18.0.12/32"},
		Credentials: []hutch.NetworkCredential{{Host: "www.test",
			Headers: map[string]string{"Authorization": hutch.RedactedValue}}}}
	if err != nil || !sameJSON(p, want) {
		t.Fatalf("network: %s %v, want %s", mustJSON(p), err, mustJSON(want))
	}
	got, err := c.Get(ctx, sb.ID)
	if err != nil || strings.Contains(mustJSON(got), "sdk-secret") || strings.Contains(mustJSON(p), "sdk-secret") {
		t.Fatalf("the credential shows: %s %s %v", mustJSON(got), mustJSON(p), err)
	}
	if out := sh(t, sb, "env; cat /etc/resolv.conf"); strings.Contains(out, "sdk-secret") {
		t.Fatalf("the sandbox sees the credential:\n%s", out)
	}

	// It is what the sandbox gets: the allowed host, with the header
	// injected on the way out; nothing else.
	curl := "curl -fsS --connect-timeout 3 -m 6 "
	if out := sh(t, sb, curl+"http://www.test/a"); !strings.Contains(out, "served-by=www.test path=/a") {
		t.Fatalf("allowed host: %q", out)
	}
	seen := in.Seen()
	if len(seen) == 0 || seen[len(seen)-1].Get("Authorization") != secret {
		t.Fatalf("the upstream did not get the credential: %v", seen)
	}
	if res, err := sb.Exec(ctx, curl+"http://api.test/"); err != nil || res.ExitCode == nil || *res.ExitCode == 0 {
		t.Fatalf("a host not allowed: %+v %v", res, err)
	}
	evs := waitEvents(t, sb, func(evs []hutch.NetworkEvent) bool {
		return hasEvent(evs, "www.test", true) && hasEvent(evs, "api.test", false)
	})
	for _, ev := range evs {
		if ev.Time.IsZero() || ev.Proto == "" {
			t.Fatalf("event %+v", ev)
		}
	}

	// Live changes: allow-all lets api.test out; deny-all nothing.
	p, err = sb.SetNetwork(ctx, hutch.NetworkPolicy{Mode: hutch.NetworkAllowAll})
	if err != nil || p.Mode != hutch.NetworkAllowAll || len(p.Credentials) != 0 {
		t.Fatalf("set allow-all: %+v %v", p, err)
	}
	if out := sh(t, sb, curl+"http://api.test/b"); !strings.Contains(out, "served-by=api.test path=/b") {
		t.Fatalf("allow-all: %q", out)
	}
	if sb, err = c.Get(ctx, sb.ID); err != nil || sb.NetworkMode != hutch.NetworkAllowAll {
		t.Fatalf("after set: %+v %v", sb, err)
	}
	if _, err := sb.SetNetwork(ctx, hutch.NetworkPolicy{}); err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Exec(ctx, curl+"http://api.test/"); err != nil || res.ExitCode == nil || *res.ExitCode == 0 {
		t.Fatalf("deny-all: %+v %v", res, err)
	}
	if p, err = sb.Network(ctx); err != nil || p.Mode != hutch.NetworkDenyAll {
		t.Fatalf("an empty policy is deny-all: %+v %v", p, err)
	}
}

func hasEvent(evs []hutch.NetworkEvent, host string, allowed bool) bool {
	for _, ev := range evs {
		// Denied DNS queries name the host with its final dot.
		if strings.TrimSuffix(ev.Host, ".") == host && ev.Allowed == allowed {
			return true
		}
	}
	return false
}

// waitEvents polls the sandbox's decisions until ok holds (the proxy logs
// a connection when it ends, which may be just after curl returns).
func waitEvents(t *testing.T, sb *hutch.Sandbox, ok func([]hutch.NetworkEvent) bool) []hutch.NetworkEvent {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		evs, err := sb.NetworkEvents(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if ok(evs) {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("events: %+v", evs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func sameJSON(a, b any) bool { return mustJSON(a) == mustJSON(b) }

func ExampleCreateOptions_network() {
	ctx := context.Background()
	c, _ := hutch.FromEnv()
	sb, err := c.Create(ctx, hutch.CreateOptions{Network: &hutch.NetworkPolicy{
		Mode:  hutch.NetworkAllowList,
		Allow: []hutch.NetworkRule{{Host: "api.github.com"}, {Host: "*.npmjs.org", Ports: []int{443}}},
		// The sandbox's requests to api.github.com get this header on the
		// way out; the sandbox never sees the token.
		Credentials: []hutch.NetworkCredential{{Host: "api.github.com",
			Headers: map[string]string{"Authorization": "Bearer " + os.Getenv("GITHUB_TOKEN")}}},
	}})
	if err != nil {
		log.Fatal(err) // ErrFailedPrecondition: the daemon runs without networking
	}
	defer sb.Delete(context.Background())
	p, _ := sb.Network(ctx)
	fmt.Println(p.Credentials[0].Headers["Authorization"]) // [redacted]
}

func ExampleClient_PortClient() {
	ctx := context.Background()
	c, _ := hutch.FromEnv()
	sb, _ := c.Create(ctx, hutch.CreateOptions{})
	defer sb.Delete(context.Background())
	_, _ = sb.StartProcess(ctx, "python3 -m http.server --bind 127.0.0.1 8000", hutch.ProcessOptions{})
	ep, err := sb.ExposePort(ctx, 8000, false)
	if err != nil {
		log.Fatal(err)
	}
	hc, base := c.PortClient(*ep) // sends ep.Token in X-Hutch-Port-Token
	resp, err := hc.Get(base + "index.html")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	fmt.Println(resp.Status)
}
