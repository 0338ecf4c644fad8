// Package router is the kernel side of hutch's sandbox networking.
//
// The daemon makes one network namespace of its own, the router, and gives
// each networked sandbox a veth pair from the router into the sandbox's
// namespace (netlink only: no `ip` commands). The router has no route
// anywhere and does not forward (ip_forward stays 0): a sandbox's packets
// can only reach sockets that live in the router namespace, which are the
// egress proxy and the DNS resolver. nftables in the router redirect every
// TCP connection a sandbox opens to the proxy and every port-53 packet to
// the resolver, and drop everything else (other UDP, ICMP, IPv6, which is
// off). The proxy and resolver then decide by policy and make outbound
// connections themselves from the host (or a configured) namespace.
//
// This fails closed: should the nftables table go, a sandbox reaches
// nothing but the proxy and resolver ports on its gateway; should the
// router go (daemon killed), the veths go with it.
package router

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Options configure a Router.
type Options struct {
	// Subnet is the IPv4 range sandboxes' links are carved from, a /30
	// each (default 10.213.0.0/16). Its first /30 is the router's own: the
	// resolver's address is its first host address.
	Subnet netip.Prefix
	// ProxyPort is the egress proxy's port in the router (default 15001).
	ProxyPort uint16
}

func (o *Options) defaults() error {
	if !o.Subnet.IsValid() {
		o.Subnet = netip.MustParsePrefix("10.213.0.0/16")
	}
	o.Subnet = o.Subnet.Masked()
	if !o.Subnet.Addr().Is4() || o.Subnet.Bits() > 28 || o.Subnet.Bits() < 8 {
		return errdefs.New(errdefs.ErrInvalidArgument, "network subnet %s: want an IPv4 prefix between /8 and /28", o.Subnet)
	}
	if o.ProxyPort == 0 {
		o.ProxyPort = 15001
	}
	return nil
}

// Link is a sandbox's attachment to the router.
type Link struct {
	ID      string
	Pid     int    // the sandbox init whose namespace holds the peer
	Iface   string // the router's end
	Gateway netip.Addr
	Addr    netip.Addr // the sandbox's address
	index   int
}

// Router owns the router namespace and the sandboxes' links into it.
type Router struct {
	opts Options
	ns   netns.NsHandle
	nl   *netlink.Handle

	mu     sync.Mutex
	links  map[string]*Link      // by sandbox id
	byAddr map[netip.Addr]string // sandbox address → id
	used   map[int]bool
	next   int

	bg     sync.WaitGroup // background link deletions
	closed bool
}

// New makes the router namespace, its loopback (with the resolver's
// address), its sysctls and its nftables rules.
func New(opts Options) (_ *Router, err error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	r := &Router{opts: opts, links: map[string]*Link{}, byAddr: map[netip.Addr]string{}, used: map[int]bool{}, next: 1}
	if r.ns, err = NewNS(); err != nil {
		return nil, fmt.Errorf("router namespace: %w", err)
	}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	if r.nl, err = netlink.NewHandleAt(r.ns); err != nil {
		return nil, fmt.Errorf("router netlink: %w", err)
	}
	if err := r.inNS(r.sysctls); err != nil {
		return nil, err
	}
	lo, err := r.nl.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	if err := r.nl.AddrAdd(lo, &netlink.Addr{IPNet: ipnet(r.DNSAddr(), 32)}); err != nil {
		return nil, fmt.Errorf("router loopback address: %w", err)
	}
	if err := r.nl.LinkSetUp(lo); err != nil {
		return nil, err
	}
	if err := installRules(r.ns, opts.ProxyPort); err != nil {
		return nil, fmt.Errorf("router nftables: %w", err)
	}
	return r, nil
}

// NewNS makes a network namespace and returns a handle on it, leaving the
// calling thread where it was.
func NewNS() (netns.NsHandle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return 0, err
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		return 0, err
	}
	if err := netns.Set(orig); err != nil {
		// This thread is stuck in the new namespace: keep it locked so
		// it dies with this goroutine instead of running other code.
		runtime.LockOSThread()
		ns.Close()
		return 0, err
	}
	return ns, nil
}

// InNS runs f on a thread inside the namespace ns: sockets f makes stay
// there. The thread goes back to where it was, or is retired.
func InNS(ns netns.NsHandle, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		return err
	}
	ferr := f()
	if err := netns.Set(orig); err != nil {
		runtime.LockOSThread() // never unlocked: the thread exits with us
		return errors.Join(ferr, err)
	}
	return ferr
}

func (r *Router) inNS(f func() error) error { return InNS(r.ns, f) }

// sysctls run inside the router: strict reverse-path filtering (a
// sandbox cannot use another's address), no forwarding, no IPv6.
func (r *Router) sysctls() error {
	for _, kv := range [][2]string{
		{"ipv4/ip_forward", "0"},
		{"ipv4/conf/all/rp_filter", "1"},
		{"ipv4/conf/default/rp_filter", "1"},
		{"ipv6/conf/all/disable_ipv6", "1"},
		{"ipv6/conf/default/disable_ipv6", "1"},
	} {
		if err := os.WriteFile("/proc/sys/net/"+kv[0], []byte(kv[1]), 0); err != nil {
			return fmt.Errorf("router sysctl %s: %w", kv[0], err)
		}
	}
	return nil
}

// DNSAddr is the resolver's address, the nameserver sandboxes are given.
func (r *Router) DNSAddr() netip.Addr { return r.opts.Subnet.Addr().Next() }

// Subnet is the range sandboxes' links are carved from.
func (r *Router) Subnet() netip.Prefix { return r.opts.Subnet }

// ProxyPort is the port the egress proxy must listen on in the router.
func (r *Router) ProxyPort() uint16 { return r.opts.ProxyPort }

// ListenTCP listens on addr inside the router namespace.
func (r *Router) ListenTCP(addr string) (net.Listener, error) {
	var ln net.Listener
	err := r.inNS(func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	})
	return ln, err
}

// ListenUDP listens on addr inside the router namespace.
func (r *Router) ListenUDP(addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := r.inNS(func() (err error) {
		pc, err = net.ListenPacket("udp4", addr)
		return err
	})
	return pc, err
}

// Lookup names the sandbox a source address in the router belongs to.
func (r *Router) Lookup(src netip.Addr) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.byAddr[src.Unmap()]
	return id, ok
}

// Attach gives the sandbox whose init is pid a link into the router: a
// veth pair whose far end becomes eth0 in the sandbox's namespace, with an
// address and a default route through the router. Attaching the same pid
// again is a no-op; a new pid (the sandbox restarted) replaces the link.
func (r *Router) Attach(ctx context.Context, id string, pid int) (Link, error) {
	if pid <= 0 {
		return Link{}, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox %s has no running init to attach a network to", id)
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return Link{}, errdefs.New(errdefs.ErrUnavailable, "the network router is closed")
	}
	if l, ok := r.links[id]; ok {
		if l.Pid == pid {
			r.mu.Unlock()
			return *l, nil
		}
		r.dropLocked(id)
	}
	idx, ok := r.allocLocked()
	r.mu.Unlock()
	if !ok {
		return Link{}, errdefs.New(errdefs.ErrResourceExhausted, "no free address left in the sandbox subnet %s", r.opts.Subnet)
	}
	l := r.linkFor(id, pid, idx)
	if err := r.plumb(l); err != nil {
		r.mu.Lock()
		delete(r.used, idx)
		r.mu.Unlock()
		r.deleteIface(l.Iface)
		return Link{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.links[id], r.byAddr[l.Addr] = l, id
	return *l, nil
}

func (r *Router) linkFor(id string, pid, idx int) *Link {
	base := r.opts.Subnet.Addr().As4()
	n := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	n += uint32(idx) * 4
	at := func(k uint32) netip.Addr {
		v := n + k
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	return &Link{ID: id, Pid: pid, Iface: "hv" + strconv.Itoa(idx), Gateway: at(1), Addr: at(2), index: idx}
}

// allocLocked picks the next free /30, round robin, so an address comes
// back into use as late as possible (a dead sandbox's veth may still be
// on its way out of the kernel).
func (r *Router) allocLocked() (int, bool) {
	total := 1 << (32 - r.opts.Subnet.Bits()) / 4
	for range total {
		idx := r.next
		r.next++
		if r.next >= total {
			r.next = 1
		}
		if idx >= 1 && !r.used[idx] {
			r.used[idx] = true
			return idx, true
		}
	}
	return 0, false
}

func (r *Router) plumb(l *Link) error {
	sbx, err := netns.GetFromPid(l.Pid)
	if err != nil {
		return fmt.Errorf("open the network namespace of pid %d: %w", l.Pid, err)
	}
	defer sbx.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: l.Iface, MTU: 1500}, PeerName: "eth0",
		PeerNamespace: netlink.NsFd(int(sbx))}
	err = r.nl.LinkAdd(veth)
	if errors.Is(err, unix.EEXIST) {
		// A former link is still on its way out: of this index here, or
		// the sandbox's previous eth0 (a detach or a daemon restart
		// deletes pairs in the background). Both are ours to remove.
		r.deleteIface(l.Iface)
		if h, herr := netlink.NewHandleAt(sbx); herr == nil {
			if old, lerr := h.LinkByName("eth0"); lerr == nil {
				_ = h.LinkDel(old)
			}
			h.Close()
		}
		err = r.nl.LinkAdd(veth)
	}
	if err != nil {
		return fmt.Errorf("add veth %s: %w", l.Iface, err)
	}
	host, err := r.nl.LinkByName(l.Iface)
	if err != nil {
		return err
	}
	if err := r.nl.AddrAdd(host, &netlink.Addr{IPNet: ipnet(l.Gateway, 30)}); err != nil {
		return fmt.Errorf("address %s: %w", l.Iface, err)
	}
	if err := r.nl.LinkSetUp(host); err != nil {
		return err
	}
	return configureSandbox(sbx, l)
}

// configureSandbox gives eth0 in the sandbox its address and a default
// route through the router.
func configureSandbox(sbx netns.NsHandle, l *Link) error {
	h, err := netlink.NewHandleAt(sbx)
	if err != nil {
		return fmt.Errorf("sandbox netlink: %w", err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("sandbox eth0: %w", err)
	}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipnet(l.Addr, 30)}); err != nil {
		return fmt.Errorf("sandbox address: %w", err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return err
	}
	gw := net.IP(l.Gateway.AsSlice())
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("sandbox default route: %w", err)
	}
	return nil
}

// Detach takes a sandbox's link away. Its address stops identifying it at
// once; the veth is deleted in the background (it costs tens of ms).
func (r *Router) Detach(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropLocked(id)
}

func (r *Router) dropLocked(id string) {
	l, ok := r.links[id]
	if !ok {
		return
	}
	delete(r.links, id)
	delete(r.byAddr, l.Addr)
	if r.closed {
		return
	}
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		r.deleteIface(l.Iface)
		r.mu.Lock()
		delete(r.used, l.index)
		r.mu.Unlock()
	}()
}

func (r *Router) deleteIface(name string) {
	if l, err := r.nl.LinkByName(name); err == nil {
		_ = r.nl.LinkDel(l)
	}
}

// Close releases the router. Its namespace (with every link) goes when
// the last socket in it is closed.
func (r *Router) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.bg.Wait()
	if r.nl != nil {
		r.nl.Close()
	}
	if r.ns.IsOpen() {
		return r.ns.Close()
	}
	return nil
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}
}
