package router

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, veth, nftables)")
	}
	if err := Probe(); err != nil {
		t.Skipf("sandbox networking is not available on this host: %v", err)
	}
}

// fakeSandbox starts a process in a fresh network namespace, standing in
// for a sandbox's init.
func fakeSandbox(t testing.TB) int {
	t.Helper()
	cmd := exec.Command("unshare", "--net", "sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Skipf("needs util-linux unshare: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// Wait until the child is in its own namespace.
	self, _ := netns.Get()
	defer self.Close()
	for range 200 {
		ns, err := netns.GetFromPid(cmd.Process.Pid)
		if err == nil {
			same := ns.Equal(self)
			ns.Close()
			if !same {
				return cmd.Process.Pid
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the fake sandbox never got its own network namespace")
	return 0
}

func newRouter(t testing.TB, opts Options) *Router {
	t.Helper()
	needRoot(t)
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// inSandbox runs f inside pid's network namespace.
func inSandbox(t testing.TB, pid int, f func() error) error {
	t.Helper()
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	return InNS(ns, f)
}

func TestAttachRedirectsAndDrops(t *testing.T) {
	r := newRouter(t, Options{Subnet: netip.MustParsePrefix("10.214.0.0/24"), ProxyPort: 15001})
	pid := fakeSandbox(t)
	l, err := r.Attach(context.Background(), "sbx-a", pid)
	if err != nil {
		t.Fatal(err)
	}
	if l.Addr.String() != "10.214.0.6" || l.Gateway.String() != "10.214.0.5" || r.DNSAddr().String() != "10.214.0.1" {
		t.Fatalf("link = %+v, dns %s", l, r.DNSAddr())
	}
	if id, ok := r.Lookup(l.Addr); !ok || id != "sbx-a" {
		t.Fatalf("Lookup = %q %v", id, ok)
	}
	again, err := r.Attach(context.Background(), "sbx-a", pid)
	if err != nil || again.Iface != l.Iface {
		t.Fatalf("re-attach: %+v %v", again, err)
	}

	proxy, err := r.ListenTCP(":15001")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	dns, err := r.ListenUDP(":53")
	if err != nil {
		t.Fatal(err)
	}
	defer dns.Close()

	// Any TCP destination lands on the proxy, from the sandbox's address.
	got := make(chan net.Addr, 4)
	go func() {
		for {
			c, err := proxy.Accept()
			if err != nil {
				return
			}
			got <- c.RemoteAddr()
			c.Close()
		}
	}()
	for _, dst := range []string{"203.0.113.9:443", "198.51.100.1:22", "10.214.0.5:8080", "169.254.169.254:80"} {
		err := inSandbox(t, pid, func() error {
			c, err := net.DialTimeout("tcp4", dst, 2*time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err != nil {
			t.Fatalf("dial %s from the sandbox: %v", dst, err)
		}
		select {
		case a := <-got:
			if !strings.HasPrefix(a.String(), l.Addr.String()+":") {
				t.Fatalf("proxy saw %s, want the sandbox's address", a)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("the proxy never saw the connection to %s", dst)
		}
	}

	// UDP 53 to anywhere reaches the resolver; other UDP goes nowhere.
	for _, dst := range []string{"8.8.8.8:53", r.DNSAddr().String() + ":53"} {
		sendUDP(t, pid, dst)
		buf := make([]byte, 64)
		_ = dns.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, from, err := dns.ReadFrom(buf)
		if err != nil || string(buf[:n]) != "ping" || !strings.HasPrefix(from.String(), l.Addr.String()) {
			t.Fatalf("resolver got %q from %v: %v", buf[:n], from, err)
		}
	}
	other, err := r.ListenUDP(":9999")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	sendUDP(t, pid, l.Gateway.String()+":9999")
	_ = other.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, _, err := other.ReadFrom(make([]byte, 8)); err == nil {
		t.Fatal("UDP to a port other than 53 reached the router")
	}

	r.Detach("sbx-a")
	if _, ok := r.Lookup(l.Addr); ok {
		t.Fatal("the address still names the sandbox after Detach")
	}
}

func sendUDP(t *testing.T, pid int, dst string) {
	t.Helper()
	err := inSandbox(t, pid, func() error {
		c, err := net.Dial("udp4", dst)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("ping"))
		return err
	})
	if err != nil {
		t.Fatalf("udp to %s: %v", dst, err)
	}
}

// A sandbox that takes another's address gets nothing through: strict
// reverse-path filtering drops it, so the proxy's source check holds.
func TestSpoofedSourceDropped(t *testing.T) {
	r := newRouter(t, Options{Subnet: netip.MustParsePrefix("10.215.0.0/24"), ProxyPort: 15002})
	a, b := fakeSandbox(t), fakeSandbox(t)
	la, err := r.Attach(context.Background(), "a", a)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := r.Attach(context.Background(), "b", b)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := r.ListenTCP(":15002")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	go func() {
		for {
			c, err := proxy.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	// Sandbox a adds b's address and dials from it.
	err = inSandbox(t, a, func() error {
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(eth, &netlink.Addr{IPNet: ipnet(lb.Addr, 32)}); err != nil {
			return err
		}
		d := net.Dialer{Timeout: 500 * time.Millisecond,
			LocalAddr: &net.TCPAddr{IP: net.IP(lb.Addr.AsSlice())}}
		c, err := d.Dial("tcp4", "203.0.113.1:443")
		if err == nil {
			c.Close()
			return errors.New("a connection from a spoofed address got through")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = la
}

func TestSubnetChecked(t *testing.T) {
	for _, s := range []string{"fd00::/64", "10.0.0.0/30", "10.0.0.0/4"} {
		if _, err := New(Options{Subnet: netip.MustParsePrefix(s)}); err == nil {
			t.Errorf("subnet %s accepted", s)
		}
	}
}

// BenchmarkAttach: a sandbox's link (veth into its namespace, addresses,
// up, default route) by netlink, and the same plumbing done the usual way
// with iproute2 commands, in the same run. Detaching is not timed.
func BenchmarkAttach(b *testing.B) {
	r := newRouter(b, Options{Subnet: netip.MustParsePrefix("10.216.0.0/16"), ProxyPort: 15003})
	pids := make([]int, 8)
	for i := range pids {
		pids[i] = fakeSandbox(b)
	}
	b.Run("netlink", func(b *testing.B) {
		var samples []time.Duration
		for i := range b.N {
			pid := pids[i%len(pids)]
			start := time.Now()
			if _, err := r.Attach(context.Background(), "s", pid); err != nil {
				b.Fatal(err)
			}
			samples = append(samples, time.Since(start))
			b.StopTimer()
			r.Detach("s")
			r.bg.Wait()
			b.StartTimer()
		}
		reportP50(b, samples)
	})
	b.Run("iproute2", func(b *testing.B) {
		if _, err := exec.LookPath("ip"); err != nil {
			b.Skip("the peer needs iproute2's ip")
		}
		var samples []time.Duration
		for i := range b.N {
			pid := strconv.Itoa(pids[i%len(pids)])
			start := time.Now()
			for _, args := range [][]string{
				{"ip", "link", "add", "hvpeer", "type", "veth", "peer", "name", "eth0", "netns", pid},
				{"ip", "addr", "add", "10.217.0.1/30", "dev", "hvpeer"},
				{"ip", "link", "set", "hvpeer", "up"},
				{"nsenter", "-t", pid, "-n", "ip", "addr", "add", "10.217.0.2/30", "dev", "eth0"},
				{"nsenter", "-t", pid, "-n", "ip", "link", "set", "eth0", "up"},
				{"nsenter", "-t", pid, "-n", "ip", "route", "add", "default", "via", "10.217.0.1"},
			} {
				if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
					b.Fatalf("%v: %v %s", args, err, out)
				}
			}
			samples = append(samples, time.Since(start))
			b.StopTimer()
			_ = exec.Command("ip", "link", "del", "hvpeer").Run()
			b.StartTimer()
		}
		reportP50(b, samples)
	})
}

func reportP50(b *testing.B, samples []time.Duration) {
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2].Microseconds())/1000, "ms-p50")
	b.ReportMetric(float64(samples[len(samples)*95/100].Microseconds())/1000, "ms-p95")
}

// Attaching again at once after a detach (the old pair still going away
// in the background) or over a stale eth0 works.
func TestReattachOverStaleLink(t *testing.T) {
	r := newRouter(t, Options{Subnet: netip.MustParsePrefix("10.218.0.0/24"), ProxyPort: 15004})
	pid := fakeSandbox(t)
	for range 20 {
		if _, err := r.Attach(context.Background(), "s", pid); err != nil {
			t.Fatal(err)
		}
		r.Detach("s")
	}
	// A stale eth0 left in the sandbox (as by a router that went away),
	// once the last detach's pair is gone.
	r.bg.Wait()
	if err := inSandbox(t, pid, func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "stale"})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Attach(context.Background(), "s", pid); err != nil {
		t.Fatal(err)
	}
	if err := inSandbox(t, pid, func() error {
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if _, err := netlink.LinkByName("stale"); err == nil {
			return errors.New("the stale pair is still there")
		}
		if addrs, _ := netlink.AddrList(eth, netlink.FAMILY_V4); len(addrs) != 1 {
			return errors.New("eth0 is not the new link")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
