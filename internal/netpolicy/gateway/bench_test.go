package gateway_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/hutch-dev/hutch/internal/netpolicy"
	"github.com/hutch-dev/hutch/internal/netpolicy/router"
	"github.com/hutch-dev/hutch/internal/sandbox"
)

// p50 reports the median of samples as ms/op-p50.
func p50(b *testing.B, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2].Microseconds())/1000, "ms-p50")
}

// BenchmarkCreate: what networking adds to a create (the manager's whole
// create, warm pool of inits on; the sandbox is destroyed untimed).
func BenchmarkCreate(b *testing.B) {
	w := newWorld(b)
	for _, mode := range []netpolicy.Mode{netpolicy.DenyAll, netpolicy.AllowList} {
		b.Run(string(mode), func(b *testing.B) {
			pol := netpolicy.Policy{Mode: mode}
			if mode == netpolicy.AllowList {
				pol.Allow = []netpolicy.Rule{{Host: "www.test"}}
			}
			// Destroys wait until the end: a destroyed sandbox's namespace
			// (and veth) is torn down by the kernel in the background,
			// holding the lock every netlink change takes, and that is
			// a cost of destroying, not of creating.
			var samples []time.Duration
			var ids []string
			for range b.N {
				start := time.Now()
				sb, err := w.d.Manager.Create(context.Background(), "", sandbox.Spec{Network: &pol})
				if err != nil {
					b.Fatal(err)
				}
				samples = append(samples, time.Since(start))
				ids = append(ids, sb.ID)
				b.StopTimer()
				time.Sleep(20 * time.Millisecond) // let the pool of inits refill
				b.StartTimer()
			}
			b.StopTimer()
			for _, id := range ids {
				_ = w.d.Manager.Delete(context.Background(), "", id)
			}
			time.Sleep(time.Second) // the kernel's namespace teardown
			b.StartTimer()
			p50(b, samples)
		})
	}
}

// clients returns an HTTP client whose connections start in the
// sandbox's namespace (through the proxy) and one whose connections start
// in the test internet itself (direct).
func (w *world) clients(b *testing.B, id string) (proxied, direct *http.Client) {
	info, err := w.d.Backend.Inspect(context.Background(), id)
	if err != nil {
		b.Fatal(err)
	}
	sbx, err := netns.GetFromPid(info.Pid)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sbx.Close() })
	in := func(ns netns.NsHandle) *http.Client {
		return &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{RootCAs: w.in.CAPool, ServerName: "www.test"},
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var c net.Conn
				err := router.InNS(ns, func() (err error) {
					var d net.Dialer
					c, err = d.DialContext(ctx, network, addr)
					return err
				})
				return c, err
			}}}
	}
	return in(sbx), in(w.in.NS)
}

// BenchmarkProxyThroughput: one 64 MiB download, through the egress proxy
// (sandbox → veth → redirect → proxy → test host) and directly (a client
// inside the test internet), in the same run; over HTTPS (the proxy
// splices the bytes) and plain HTTP (the proxy relays it request by
// request, checking each Host).
func BenchmarkProxyThroughput(b *testing.B) {
	w := newWorld(b)
	id := w.create(netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{Host: "www.test"}}})
	proxied, direct := w.clients(b, id)
	const size = 64 << 20
	for _, scheme := range []string{"https", "http"} {
		for _, c := range []struct {
			name string
			hc   *http.Client
		}{{"proxied", proxied}, {"direct", direct}} {
			b.Run(scheme+"/"+c.name, func(b *testing.B) {
				b.SetBytes(size)
				for range b.N {
					get(b, c.hc, fmt.Sprintf("%s://198.18.0.10/bytes/%d", scheme, size), size)
				}
			})
		}
	}
}

// BenchmarkProxyLatency: a new connection (and TLS handshake) and a
// one-byte GET, through the proxy and directly.
func BenchmarkProxyLatency(b *testing.B) {
	w := newWorld(b)
	id := w.create(netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{Host: "www.test"}}})
	proxied, direct := w.clients(b, id)
	for _, c := range []struct {
		name string
		hc   *http.Client
	}{{"proxied", proxied}, {"direct", direct}} {
		for _, scheme := range []string{"https", "http"} {
			b.Run(scheme+"/"+c.name, func(b *testing.B) {
				var samples []time.Duration
				for range b.N {
					start := time.Now()
					get(b, c.hc, scheme+"://198.18.0.10/bytes/1", 1)
					samples = append(samples, time.Since(start))
				}
				p50(b, samples)
			})
		}
	}
}

func get(b *testing.B, hc *http.Client, url string, want int64) {
	req, _ := http.NewRequest("GET", url, nil)
	req.Host = "www.test"
	res, err := hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err != nil || n != want || res.StatusCode != http.StatusOK {
		b.Fatalf("GET %s: %d, %d bytes, %v", url, res.StatusCode, n, err)
	}
}

// BenchmarkProxyThroughputShaped: the same download when the outside link
// is 1 Gbit/s (a token bucket on the test internet's loopback, which both
// the proxy's and the direct client's connections cross): what a sandbox
// sees when the network, not the CPU, is the limit.
func BenchmarkProxyThroughputShaped(b *testing.B) {
	w := newWorld(b)
	h, err := netlink.NewHandleAt(w.in.NS)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		b.Fatal(err)
	}
	// 1 Gbit/s; the buffer is bytes of burst at that rate, in ticks as
	// netlink wants it (the library converts from bytes).
	tbf := &netlink.Tbf{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: lo.Attrs().Index, Handle: netlink.MakeHandle(1, 0),
		Parent: netlink.HANDLE_ROOT}, Rate: 125_000_000, Limit: 4 << 20, Buffer: 1 << 20}
	if err := h.QdiscAdd(tbf); err != nil {
		b.Skipf("cannot shape the test link (tbf qdisc): %v", err)
	}
	id := w.create(netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{Host: "www.test"}}})
	proxied, direct := w.clients(b, id)
	const size = 32 << 20
	for _, c := range []struct {
		name string
		hc   *http.Client
	}{{"proxied", proxied}, {"direct", direct}} {
		b.Run("https/"+c.name, func(b *testing.B) {
			b.SetBytes(size)
			for range b.N {
				get(b, c.hc, fmt.Sprintf("https://198.18.0.10/bytes/%d", size), size)
			}
		})
	}
}
