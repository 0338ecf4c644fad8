package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/netpolicy"
)

// Proxy is the transparent egress proxy. Per accepted connection it finds
// the sandbox and its current policy, reads the first bytes for a name
// (TLS SNI or HTTP Host) and then:
//
//   - a name the policy admits on the original port: the proxy resolves
//     the name itself and dials the first address the policy lets it dial,
//     so a spoofed SNI or Host reaches only the named host. Plain HTTP is
//     then proxied request by request (each request's Host must be that
//     name, or it is answered 421), and hosts with credential rules get
//     their TLS terminated with a leaf from the CA so the credentials can
//     be added. Other TLS is replayed and spliced untouched.
//   - no admitted name: the connection goes to its original address only
//     if the policy admits that address as such (IPAllowed).
//   - anything else is closed (plain HTTP first gets a 403 saying why).
//
// Servers that speak first (SMTP, MySQL, ...) never get a name: the client
// sends nothing. Waiting the full PeekTimeout before dialing them would
// add seconds to every such connection, and not waiting would let a slow
// client skip the name check. The proxy waits only ServerFirstWait when
// the name cannot change the outcome: the original address is admitted by
// IPAllowed (so the connection may go there whatever the client says) and
// the policy has no credential rules (so no name could need
// interception). If bytes arrive later they flow to that admitted address,
// which the policy allows anyway. In every other case the proxy waits up
// to PeekTimeout, and a silent client then goes to its original address
// only if IPAllowed admits it.
type Proxy struct {
	cfg  Config
	bufs sync.Pool // *[]byte of maxPeek bytes, for the peek

	mu   sync.Mutex
	live map[string]map[*conn]struct{} // connections being handled, by sandbox
}

// NewProxy returns a proxy; cfg.Lookup is required (Serve says so).
func NewProxy(cfg Config) *Proxy {
	p := &Proxy{cfg: cfg.withDefaults(), live: map[string]map[*conn]struct{}{}}
	p.bufs.New = func() any { b := make([]byte, maxPeek); return &b }
	return p
}

// Serve accepts connections on ln until ctx ends, then closes ln, closes
// every connection it is handling and returns nil once all of them are
// done. Any other accept error ends Serve the same way and is returned.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	if p.cfg.Lookup == nil {
		ln.Close()
		return errdefs.New(errdefs.ErrInvalidArgument, "egress proxy: Config.Lookup is required")
	}
	return serveListener(ctx, ln, p.handle)
}

// serveListener runs handle for each accepted connection on a goroutine it
// owns and waits for them all before returning.
func serveListener(ctx context.Context, ln net.Listener, handle func(context.Context, net.Conn)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	// However the loop ends, the connections end with it (an accept error
	// must not leave Serve waiting on them).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer ln.Close()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if temporaryAcceptError(err) {
				// Out of file descriptors and the like: back off as
				// net/http does instead of spinning or giving up.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(delay):
				case <-ctx.Done():
				}
				continue
			}
			return fmt.Errorf("egress accept: %w", err)
		}
		delay = 0
		wg.Go(func() { handle(ctx, c) })
	}
}

func temporaryAcceptError(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// conn is one accepted connection on its way through the proxy.
type conn struct {
	c    net.Conn
	src  netip.Addr
	pol  *netpolicy.Compiled
	orig netip.AddrPort
	d    Decision
	head []byte  // bytes read while looking for a name, replayed upstream
	buf  *[]byte // head's pooled buffer, nil once released
	// grant is what the connection was let through for, set (under
	// Proxy.mu) once it goes out; Revalidate judges it again, and sets
	// revoked when it closes it.
	grant   *grant
	revoked bool
}

// grant is what an admitted connection may do: reach a name (and, spliced,
// the address dialed for it) or an address, on a port; a relayed HTTP
// connection also holds the credentials it injects.
type grant struct {
	name   string // "" when admitted by address
	ip     netip.Addr
	port   int
	relay  bool              // HTTP relayed request by request (dials per request)
	creds  map[string]string // injected on a relayed connection
	spoken bool              // a name was given but the address admitted it (fallback)
}

func (p *Proxy) handle(ctx context.Context, c net.Conn) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	cn := &conn{c: c, d: Decision{Time: time.Now(), Proto: "tcp"}}
	defer func() { p.cfg.Log(cn.d) }()

	cn.src = addrOf(c.RemoteAddr())
	id, pol, ok := p.cfg.Lookup(cn.src)
	if !ok || pol == nil {
		cn.d.Reason = "unknown source address"
		return
	}
	cn.d.Sandbox, cn.pol = id, pol
	if !p.admit(cn) {
		cn.d.Reason = fmt.Sprintf("over %d open connections", p.cfg.MaxConnsPerSandbox)
		return
	}
	defer p.done(cn)
	orig, err := p.cfg.OriginalDst(c)
	if err != nil || !orig.Addr().IsValid() || orig.Port() == 0 {
		cn.d.Reason = "no original destination"
		return
	}
	cn.orig = orig
	cn.d.IP, cn.d.Port = orig.Addr().Unmap(), int(orig.Port())
	if pol.Mode() == netpolicy.DenyAll {
		cn.d.Reason = "policy is deny-all"
		return
	}
	cn.buf = p.bufs.Get().(*[]byte)
	defer p.releaseBuf(cn)
	ipOK := pol.IPAllowed(cn.d.IP, cn.d.Port, p.cfg.Extra())
	name, closed := p.peek(cn, *cn.buf, ipOK && len(pol.Policy().Credentials) == 0)
	if closed {
		cn.d.Reason = "client sent nothing and closed"
		return
	}
	p.route(ctx, cn, name, ipOK)
}

// admit counts a connection of sandbox id, unless it already has
// MaxConnsPerSandbox open: one sandbox cannot take all of the daemon's
// file descriptors (each proxied connection holds two).
func (p *Proxy) admit(cn *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	id := cn.d.Sandbox
	if len(p.live[id]) >= p.cfg.MaxConnsPerSandbox {
		return false
	}
	if p.live[id] == nil {
		p.live[id] = map[*conn]struct{}{}
	}
	p.live[id][cn] = struct{}{}
	return true
}

func (p *Proxy) done(cn *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id := cn.d.Sandbox
	delete(p.live[id], cn)
	if len(p.live[id]) == 0 {
		delete(p.live, id)
	}
}

// grantConn records what cn goes out for. A policy that changed since cn
// was accepted (after Revalidate looked at it) is asked again: false means
// the sandbox's current policy refuses it.
func (p *Proxy) grantConn(cn *conn, g grant) bool {
	p.mu.Lock()
	cn.grant = &g
	p.mu.Unlock()
	_, cur, ok := p.cfg.Lookup(cn.src)
	if !ok || cur == nil {
		return false
	}
	return cur == cn.pol || stillAllowed(cur, g, p.cfg.Extra())
}

// Revalidate judges sandbox id's open connections by its new policy and
// closes those it no longer admits: a name or address taken off the list,
// deny-all, or (for relayed HTTP) different credentials for the name. It
// returns how many it closed. Call it after Lookup returns the new policy.
func (p *Proxy) Revalidate(id string, pol *netpolicy.Compiled) int {
	extra := p.cfg.Extra()
	var victims []*conn
	p.mu.Lock()
	for cn := range p.live[id] {
		if g := cn.grant; g != nil && !cn.revoked && !stillAllowed(pol, *g, extra) {
			cn.revoked = true // closing: counted once, however many changes follow
			victims = append(victims, cn)
		}
	}
	p.mu.Unlock()
	for _, cn := range victims {
		cn.c.Close() // its splice or relay then closes the upstream side
	}
	return len(victims)
}

// stillAllowed reports whether pol admits what g was granted.
func stillAllowed(pol *netpolicy.Compiled, g grant, extra []netip.Prefix) bool {
	if pol == nil || pol.Mode() == netpolicy.DenyAll {
		return false
	}
	switch {
	case g.relay:
		// Its upstream dials use the policy it started with: keep it only
		// while the name is allowed and its credentials are the same.
		return pol.HostAllowed(g.name, g.port) && maps.Equal(pol.Credentials(g.name), g.creds)
	case g.name != "" && !g.spoken:
		return pol.HostAllowed(g.name, g.port) && pol.DialAllowed(g.ip, g.port, extra)
	default:
		return pol.IPAllowed(g.ip, g.port, extra)
	}
}

// releaseBuf returns the peek buffer to the pool once nothing refers to
// it any more.
func (p *Proxy) releaseBuf(cn *conn) {
	if cn.buf != nil {
		p.bufs.Put(cn.buf)
		cn.buf = nil
	}
}

// route sends a connection where its name or address lets it go.
func (p *Proxy) route(ctx context.Context, cn *conn, name string, ipOK bool) {
	cn.d.Host = name
	pol, port := cn.pol, cn.d.Port
	switch {
	case name != "" && pol.HostAllowed(name, port):
		relay := grant{name: name, port: port, relay: true, creds: pol.Credentials(name)}
		if cn.d.Proto == "http" {
			if !p.grantConn(cn, relay) {
				cn.d.Reason = "the policy changed: name no longer allowed"
				refuseHTTP(cn.c, cn.d.Reason)
				return
			}
			p.serveHTTP(ctx, cn, name, false)
			return
		}
		if cn.d.Proto == "tls" && pol.Intercepts(name) {
			if p.cfg.CA == nil {
				cn.d.Reason = "credential rule, but the proxy has no CA to intercept with"
				return
			}
			if !p.grantConn(cn, relay) {
				cn.d.Reason = "the policy changed: name no longer allowed"
				return
			}
			p.serveHTTP(ctx, cn, name, true)
			return
		}
		up, ip, err := p.dialName(ctx, pol, name, port)
		cn.d.IP = ip
		cn.d.Allowed, cn.d.Reason = true, "name allowed"
		if err != nil && ipOK {
			// The name reached no address the policy allows (or none
			// answered), but the original address is allowed as such: the
			// client could have gone there without naming anything, so
			// this grants nothing new.
			cn.d.IP = cn.orig.Addr().Unmap()
			cn.d.Reason = "address allowed (the name reached no allowed address)"
			up, err = p.dialIP(ctx, pol, cn.d.IP, port, p.cfg.Extra())
		}
		if err != nil {
			cn.d.Allowed, cn.d.Reason = false, err.Error()
			return
		}
		spoken := cn.d.Reason != "name allowed"
		if !p.grantConn(cn, grant{name: name, ip: cn.d.IP, port: port, spoken: spoken}) {
			up.Close()
			cn.d.Allowed, cn.d.Reason = false, "the policy changed: no longer allowed"
			return
		}
		p.splice(ctx, cn, up)
	case ipOK:
		up, err := p.dialIP(ctx, pol, cn.d.IP, port, p.cfg.Extra())
		if err != nil {
			cn.d.Reason = err.Error()
			return
		}
		if !p.grantConn(cn, grant{ip: cn.d.IP, port: port}) {
			up.Close()
			cn.d.Reason = "the policy changed: address no longer allowed"
			return
		}
		cn.d.Allowed, cn.d.Reason = true, "address allowed"
		p.splice(ctx, cn, up)
	default:
		if name == "" {
			cn.d.Reason = "no name, and the address is not allowed"
		} else {
			cn.d.Reason = "name not allowed on this port, nor the address"
		}
		if cn.d.Proto == "http" {
			refuseHTTP(cn.c, cn.d.Reason)
		}
	}
}

// peek reads the client's first bytes into buf until it can tell a name
// (or that there is none), and leaves them in cn.head. quick selects the
// short wait for a silent client described on Proxy. closed reports a
// client that closed without sending anything.
func (p *Proxy) peek(cn *conn, buf []byte, quick bool) (name string, closed bool) {
	c := cn.c
	deadline := cn.d.Time.Add(p.cfg.PeekTimeout)
	first := deadline
	if quick && p.cfg.ServerFirstWait < p.cfg.PeekTimeout {
		first = cn.d.Time.Add(p.cfg.ServerFirstWait)
	}
	defer c.SetReadDeadline(time.Time{})
	n := 0
	for {
		dl := deadline
		if n == 0 {
			dl = first
		}
		c.SetReadDeadline(dl)
		m, err := c.Read(buf[n:])
		n += m
		cn.head = buf[:n]
		if n > 0 {
			st, nm := p.sniff(cn)
			if st != needMore {
				return nm, false
			}
			if n == len(buf) {
				return "", false // a head this long is not one we read
			}
		}
		if err != nil {
			// A timeout or EOF mid-head: what has arrived carries no name
			// we can trust, and a silent client has none at all.
			return "", n == 0 && !isTimeout(err)
		}
	}
}

// sniff classifies cn.head and sets the decision's protocol.
func (p *Proxy) sniff(cn *conn) (sniffState, string) {
	b := cn.head
	if b[0] == recordTypeHS {
		cn.d.Proto = "tls"
		st, name := sniffTLS(b)
		if st == opaque {
			cn.d.Proto = "tcp"
		}
		return st, name
	}
	st, name := sniffHTTP(b)
	switch st {
	case found:
		cn.d.Proto = "http"
	case opaque:
		cn.d.Proto = "tcp"
	}
	return st, name
}

// splice replays the peeked bytes to up and copies both ways until both
// sides are done, counting bytes.
//
// Between two *net.TCPConn io.Copy uses splice(2), so no payload passes
// through user space and no buffer is held while a connection idles. A
// 64 KB user-space copy measured the same here (BenchmarkThroughput/proxy,
// 30000 x 64 KB: 1.46-1.65 GB/s and 1.9 s of CPU either way), so the
// choice rests on memory: splice holds two pipes per connection in the
// kernel instead of two buffers in the daemon.
func (p *Proxy) splice(ctx context.Context, cn *conn, up net.Conn) {
	stop := context.AfterFunc(ctx, func() { up.Close() })
	defer stop()
	defer up.Close()
	if len(cn.head) > 0 {
		n, err := up.Write(cn.head)
		cn.d.BytesUp += int64(n)
		if err != nil {
			return
		}
	}
	cn.head = nil
	p.releaseBuf(cn) // replayed: the rest of a long connection needs none
	var wg sync.WaitGroup
	var upN int64
	wg.Go(func() {
		upN = pipe(up, cn.c)
	})
	cn.d.BytesDown = pipe(cn.c, up)
	wg.Wait()
	cn.d.BytesUp += upN
}

// pipe copies src to dst. At src's EOF it half-closes dst so the other
// side sees the end too; on an error it closes both, so the copy in the
// other direction ends as well instead of waiting forever.
func pipe(dst, src net.Conn) int64 {
	n, err := io.Copy(dst, src)
	if err == nil {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return n
		}
	}
	dst.Close()
	src.Close()
	return n
}

// refuseHTTP answers a refused plain-HTTP request with a 403 saying why,
// then lets the client read it before the connection closes (closing with
// unread request bytes would reset the connection and lose the answer).
func refuseHTTP(c net.Conn, reason string) {
	body := "hutch egress: " + reason + "\n"
	c.SetDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	}
}

// addrOf returns the IP of a connection's address, or the zero Addr.
func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	case *net.UDPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	if a == nil {
		return netip.Addr{}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}
