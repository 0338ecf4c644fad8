// Package gateway puts hutch's sandbox networking together: the router
// (namespace, veths, nftables), the egress proxy and DNS resolver serving
// inside it, the per-daemon CA, the sandboxes' current policies, and the
// record of their decisions (a per-sandbox log and /metrics). The manager
// drives it through sandbox.Network.
package gateway

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"

	"github.com/hutch-dev/hutch/internal/netpolicy"
	"github.com/hutch-dev/hutch/internal/netpolicy/egress"
	"github.com/hutch-dev/hutch/internal/netpolicy/router"
)

// Options configure a Gateway.
type Options struct {
	Router router.Options
	// DataDir keeps the CA (DataDir/ca).
	DataDir string
	// EgressNetNS is a network namespace file (e.g. /run/netns/x) that
	// outbound connections and DNS lookups are made from; empty: the
	// daemon's own. Tests point it at a namespace holding test hosts.
	EgressNetNS string
	// DNSUpstream is the server ("ip:port") names are resolved with;
	// empty: the system's resolver.
	DNSUpstream string
	// UpstreamRoots verify the real hosts behind intercepted connections;
	// nil: the system roots.
	UpstreamRoots *x509.CertPool
	Logger        *slog.Logger
}

// eventsKept is how many decisions a sandbox's log keeps.
const eventsKept = 256

// Gateway enforces network policies. It implements sandbox.Network.
type Gateway struct {
	opts   Options
	log    *slog.Logger
	r      *router.Router
	ca     *egress.CA
	egress netns.NsHandle // -1: the daemon's own

	mu     sync.Mutex
	pols   map[string]*netpolicy.Compiled
	events map[string]*ring
	extra  []netip.Prefix

	decisions *prometheus.CounterVec
	bytes     *prometheus.CounterVec

	proxy   *egress.Proxy
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	closers []func() error
}

// New builds the router and starts the proxy and resolver in it.
func New(opts Options) (_ *Gateway, err error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	g := &Gateway{opts: opts, log: opts.Logger, egress: -1, pols: map[string]*netpolicy.Compiled{},
		events: map[string]*ring{},
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hutch_egress_decisions_total",
			Help: "Egress connections and DNS queries of sandboxes, by protocol and outcome."}, []string{"proto", "allowed"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hutch_egress_bytes_total",
			Help: "Bytes through the egress proxy, by direction (up: from sandboxes)."}, []string{"direction"}),
	}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	if opts.EgressNetNS != "" {
		if g.egress, err = netns.GetFromPath(opts.EgressNetNS); err != nil {
			return nil, fmt.Errorf("egress namespace %s: %w", opts.EgressNetNS, err)
		}
	}
	if g.r, err = router.New(opts.Router); err != nil {
		return nil, err
	}
	g.closers = append(g.closers, g.r.Close)
	if g.ca, err = egress.LoadOrCreateCA(filepath.Join(opts.DataDir, "ca")); err != nil {
		return nil, err
	}
	g.refreshExtra()
	cfg := egress.Config{Lookup: g.lookup, Dial: g.dial, LookupIP: g.lookupIP(), Extra: g.extraRanges,
		CA: g.ca, UpstreamRoots: opts.UpstreamRoots, Log: g.record}
	return g, g.serve(cfg)
}

func (g *Gateway) serve(cfg egress.Config) error {
	proxyLn, err := g.r.ListenTCP(":" + strconv.Itoa(int(g.r.ProxyPort())))
	if err != nil {
		return fmt.Errorf("egress proxy listener: %w", err)
	}
	dnsTCP, err := g.r.ListenTCP(":53")
	if err != nil {
		proxyLn.Close()
		return fmt.Errorf("resolver listener: %w", err)
	}
	dnsUDP, err := g.r.ListenUDP(":53")
	if err != nil {
		proxyLn.Close()
		dnsTCP.Close()
		return fmt.Errorf("resolver listener: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	proxy, res := egress.NewProxy(cfg), egress.NewResolver(cfg)
	g.proxy = proxy
	run := func(name string, f func() error) {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			if err := f(); err != nil && ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				g.log.Error("network service stopped", "service", name, "err", err)
			}
		}()
	}
	run("egress proxy", func() error { return proxy.Serve(ctx, proxyLn) })
	run("resolver (tcp)", func() error { return res.ServeTCP(ctx, dnsTCP) })
	run("resolver (udp)", func() error { return res.ServeUDP(ctx, dnsUDP) })
	run("address refresher", func() error {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				g.refreshExtra()
			}
		}
	})
	return nil
}

// Apply implements sandbox.Network.
func (g *Gateway) Apply(ctx context.Context, id string, pid int, pol *netpolicy.Compiled) error {
	g.mu.Lock()
	g.pols[id] = pol
	g.mu.Unlock()
	// Open connections the new policy refuses end now, not when they do.
	if n := g.proxy.Revalidate(id, pol); n > 0 {
		g.log.Info("egress connections closed by a policy change", "sandbox", id, "closed", n)
	}
	if !pol.Networked() {
		g.r.Detach(id)
		return nil
	}
	_, err := g.r.Attach(ctx, id, pid)
	return err
}

// Release implements sandbox.Network.
func (g *Gateway) Release(id string) {
	g.r.Detach(id)
	g.mu.Lock()
	delete(g.pols, id)
	delete(g.events, id)
	g.mu.Unlock()
}

// Events implements sandbox.EventSource.
func (g *Gateway) Events(id string) []netpolicy.Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	if r := g.events[id]; r != nil {
		return r.list()
	}
	return []netpolicy.Event{}
}

// CAPEM is the CA certificate sandboxes trust.
func (g *Gateway) CAPEM() []byte { return g.ca.CertPEM() }

// Nameserver is the resolver's address, for sandboxes' /etc/resolv.conf.
func (g *Gateway) Nameserver() netip.Addr { return g.r.DNSAddr() }

// Collectors are the gateway's metrics.
func (g *Gateway) Collectors() []prometheus.Collector {
	return []prometheus.Collector{g.decisions, g.bytes}
}

// Close stops the services and removes the router (and every link).
func (g *Gateway) Close() error {
	if g.cancel != nil {
		g.cancel()
	}
	g.wg.Wait()
	var errs []error
	for i := len(g.closers) - 1; i >= 0; i-- {
		errs = append(errs, g.closers[i]())
	}
	g.closers = nil
	if g.egress.IsOpen() {
		g.egress.Close()
		g.egress = -1
	}
	return errors.Join(errs...)
}

func (g *Gateway) lookup(src netip.Addr) (string, *netpolicy.Compiled, bool) {
	id, ok := g.r.Lookup(src)
	if !ok {
		return "", nil, false
	}
	g.mu.Lock()
	pol := g.pols[id]
	g.mu.Unlock()
	if pol == nil || !pol.Networked() {
		return id, nil, false
	}
	return id, pol, true
}

// dial connects from the egress namespace. The proxy has checked addr.
func (g *Gateway) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	if !g.egress.IsOpen() {
		return d.DialContext(ctx, network, addr)
	}
	var c net.Conn
	err := router.InNS(g.egress, func() (err error) {
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

func (g *Gateway) lookupIP() func(ctx context.Context, host string) ([]netip.Addr, error) {
	r := net.DefaultResolver
	if g.opts.DNSUpstream != "" || g.egress.IsOpen() {
		upstream := g.opts.DNSUpstream
		r = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if upstream != "" {
				addr = upstream
			}
			return g.dial(ctx, network, addr)
		}}
	}
	c := &dnsCache{entries: map[string]dnsEntry{}}
	return func(ctx context.Context, host string) ([]netip.Addr, error) {
		return c.lookup(ctx, host, func(ctx context.Context) ([]netip.Addr, error) {
			return r.LookupNetIP(ctx, "ip4", host)
		})
	}
}

// dnsTTL is how long a lookup is reused. Short: it saves the upstream
// round trip for a burst of connections (a package install) and keeps the
// resolver's answers and the proxy's dials agreeing, without outliving a
// real record's TTL by much. Every address is still checked before a dial.
const dnsTTL = 5 * time.Second

type dnsEntry struct {
	addrs []netip.Addr
	until time.Time
}

// dnsCache keeps successful lookups for dnsTTL (at most 4096 names).
type dnsCache struct {
	mu      sync.Mutex
	entries map[string]dnsEntry
}

func (c *dnsCache) lookup(ctx context.Context, host string, resolve func(context.Context) ([]netip.Addr, error)) ([]netip.Addr, error) {
	now := time.Now()
	c.mu.Lock()
	e, ok := c.entries[host]
	c.mu.Unlock()
	if ok && now.Before(e.until) {
		return e.addrs, nil
	}
	addrs, err := resolve(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if len(c.entries) >= 4096 {
		for k, v := range c.entries {
			if now.After(v.until) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= 4096 {
			clear(c.entries)
		}
	}
	c.entries[host] = dnsEntry{addrs: addrs, until: now.Add(dnsTTL)}
	c.mu.Unlock()
	return addrs, nil
}

func (g *Gateway) extraRanges() []netip.Prefix {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.extra
}

// refreshExtra lists the addresses no sandbox may reach on top of the
// built-in ranges: the sandboxes' subnet and every address of the host
// (the daemon's namespace; an egress namespace is a test's stand-in for
// the outside world, whose addresses are the point).
func (g *Gateway) refreshExtra() {
	extra := []netip.Prefix{g.r.Subnet()}
	add := func() error {
		addrs, err := net.InterfaceAddrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					ip = ip.Unmap()
					extra = append(extra, netip.PrefixFrom(ip, ip.BitLen()))
				}
			}
		}
		return err
	}
	_ = add()
	g.mu.Lock()
	g.extra = extra
	g.mu.Unlock()
}

// record keeps a decision in the sandbox's log, the daemon's log and the
// metrics.
func (g *Gateway) record(d egress.Decision) {
	ev := netpolicy.Event{Time: d.Time, Proto: d.Proto, Host: d.Host, Port: d.Port, Allowed: d.Allowed,
		Reason: d.Reason, BytesUp: d.BytesUp, BytesDown: d.BytesDown}
	if d.IP.IsValid() {
		ev.IP = d.IP.String()
	}
	g.decisions.WithLabelValues(d.Proto, strconv.FormatBool(d.Allowed)).Inc()
	g.bytes.WithLabelValues("up").Add(float64(d.BytesUp))
	g.bytes.WithLabelValues("down").Add(float64(d.BytesDown))
	// Refusals at info (what an operator looks for); allowed traffic, which
	// a package install makes by the hundred, at debug. The sandbox's own
	// log and the metrics keep both.
	level := slog.LevelInfo
	if d.Allowed {
		level = slog.LevelDebug
	}
	g.log.Log(context.Background(), level, "egress", "sandbox", d.Sandbox, "proto", d.Proto, "host", d.Host, "ip", ev.IP,
		"port", d.Port, "allowed", d.Allowed, "reason", d.Reason, "up", d.BytesUp, "down", d.BytesDown)
	if d.Sandbox == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, live := g.pols[d.Sandbox]; !live {
		return
	}
	r := g.events[d.Sandbox]
	if r == nil {
		r = &ring{}
		g.events[d.Sandbox] = r
	}
	r.add(ev)
}

// ring keeps the last eventsKept events.
type ring struct {
	buf [eventsKept]netpolicy.Event
	n   int // total added
}

func (r *ring) add(e netpolicy.Event) {
	r.buf[r.n%eventsKept] = e
	r.n++
}

func (r *ring) list() []netpolicy.Event {
	k := min(r.n, eventsKept)
	out := make([]netpolicy.Event, 0, k)
	for i := r.n - k; i < r.n; i++ {
		out = append(out, r.buf[i%eventsKept])
	}
	return out
}
