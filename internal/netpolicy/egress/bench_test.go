package egress

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"

	"github.com/hutch-dev/hutch/internal/netpolicy"
)

// The benchmarks compare a direct loopback connection to the same
// connection through the proxy, in the same run, so docs/BENCHMARKS.md can
// report the proxy's throughput and added latency as ratios:
//
//	CGO_ENABLED=0 go test -run '^$' -bench . -benchtime 2s ./internal/netpolicy/egress/

var ipBulk = netip.MustParseAddr("198.51.100.40")

// benchWorld is a world with a bulk server (writes forever) at
// ipBulk:9000 admitted by a CIDR rule, plus allowed.test by name.
func benchWorld(b *testing.B) *world {
	pol := allowList("allowed.test")
	pol.Allow = append(pol.Allow, netpolicy.Rule{CIDR: ipBulk.String()}, netpolicy.Rule{CIDR: ipSrvFirst.String()})
	w := newWorld(b, pol, func(c *Config) { c.Log = func(Decision) {} })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	b.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			})
		}
	})
	w.backends[netip.AddrPortFrom(ipBulk, 9000)] = ln.Addr().String()
	return w
}

// dialBench opens a connection to orig, directly or through the proxy.
func (w *world) dialBench(b *testing.B, orig netip.AddrPort, viaProxy bool) net.Conn {
	if !viaProxy {
		c, err := net.Dial("tcp", w.backends[orig])
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	c, err := net.Dial("tcp", w.proxyAddr)
	if err != nil {
		b.Fatal(err)
	}
	w.orig.set(c.LocalAddr().String(), orig)
	return c
}

var modes = []struct {
	name  string
	proxy bool
}{{"direct", false}, {"proxy", true}}

// BenchmarkThroughput reads a bulk download over one connection (the
// proxy splices it: the address is admitted by a CIDR rule and the client
// sends a few bytes that name nothing).
func BenchmarkThroughput(b *testing.B) {
	w := benchWorld(b)
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			c := w.dialBench(b, netip.AddrPortFrom(ipBulk, 9000), m.proxy)
			defer c.Close()
			c.Write([]byte{0, 1, 2, 3}) // not TLS, not HTTP: no name, decided at once
			buf := make([]byte, 64<<10)
			b.SetBytes(int64(len(buf)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRoundTrip is one 64-byte echo over an established connection:
// the latency the proxy adds to every exchange.
func BenchmarkRoundTrip(b *testing.B) {
	w := benchWorld(b)
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			c := w.dialBench(b, netip.AddrPortFrom(ipSrvFirst, 25), m.proxy)
			defer c.Close()
			br := bufio.NewReader(c)
			if _, err := br.ReadString('\n'); err != nil { // the banner
				b.Fatal(err)
			}
			msg := make([]byte, 64)
			got := make([]byte, 64)
			for b.Loop() {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(br, got); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkConnect is a new connection with one request and its answer:
// the cost of the proxy's accept, name check, resolution and dial. HTTP
// is proxied request by request; TLS is spliced after the SNI check (the
// handshake is end to end in both modes).
func BenchmarkConnect(b *testing.B) {
	w := benchWorld(b)
	roots := w.roots
	for _, proto := range []string{"http", "tls"} {
		for _, m := range modes {
			b.Run(proto+"/"+m.name, func(b *testing.B) {
				port := uint16(80)
				if proto == "tls" {
					port = 443
				}
				for b.Loop() {
					var c net.Conn = w.dialBench(b, netip.AddrPortFrom(ipAllowed, port), m.proxy)
					if proto == "tls" {
						c = tls.Client(c, &tls.Config{ServerName: "allowed.test", RootCAs: roots})
					}
					io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil || resp.StatusCode != 200 {
						b.Fatal(resp, err)
					}
					io.Copy(io.Discard, resp.Body)
					c.Close()
				}
			})
		}
	}
}
