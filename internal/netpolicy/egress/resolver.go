package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/netpolicy"
)

const (
	dnsLookupTimeout = 5 * time.Second
	dnsTCPIdle       = 10 * time.Second
	dnsMaxInflight   = 256 // upstream lookups in flight over UDP; more are dropped and retried by the client
	// dnsMaxAnswers keeps every answer under 512 bytes (even for a
	// 253-byte name), the UDP size every client accepts without EDNS.
	dnsMaxAnswers = 8
	dnsMaxQuery   = 1500
)

// Resolver is the sandboxes' DNS server. It answers A queries for the
// names the sandbox's policy admits (NameAllowed), resolving them upstream
// with a short TTL; AAAA and other types of an admitted name get an empty
// NOERROR answer (IPv6 is off in sandboxes); every other name gets
// NXDOMAIN. Only admitted A queries ever cause an upstream lookup, so a
// sandbox cannot smuggle data out in the names it asks for.
type Resolver struct {
	cfg Config
}

// NewResolver returns a resolver; cfg.Lookup is required.
func NewResolver(cfg Config) *Resolver { return &Resolver{cfg: cfg.withDefaults()} }

// dnsQuery is a parsed query on its way to an answer.
type dnsQuery struct {
	hdr dnsmessage.Header
	q   dnsmessage.Question
	d   Decision
}

// ServeUDP answers queries on pc until ctx ends, then closes pc and
// returns nil once every query in flight is answered or abandoned.
func (r *Resolver) ServeUDP(ctx context.Context, pc net.PacketConn) error {
	if r.cfg.Lookup == nil {
		pc.Close()
		return errdefs.New(errdefs.ErrInvalidArgument, "egress resolver: Config.Lookup is required")
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { pc.Close() })
	defer stop()
	defer pc.Close()
	sem := make(chan struct{}, dnsMaxInflight)
	buf := make([]byte, dnsMaxQuery)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			if isTimeout(err) {
				continue
			}
			return err
		}
		q, resp := r.parse(addrOf(addr), buf[:n])
		if resp != nil || q == nil {
			if resp != nil {
				pc.WriteTo(resp, addr)
			}
			continue
		}
		// Only an admitted A query waits for upstream; it gets its own
		// goroutine so one slow name does not hold up the others.
		select {
		case sem <- struct{}{}:
		default:
			q.d.Reason = "resolver busy"
			r.cfg.Log(q.d)
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			pc.WriteTo(r.resolve(ctx, q), addr)
		})
	}
}

// ServeTCP answers DNS over TCP on ln until ctx ends, like ServeUDP.
func (r *Resolver) ServeTCP(ctx context.Context, ln net.Listener) error {
	if r.cfg.Lookup == nil {
		ln.Close()
		return errdefs.New(errdefs.ErrInvalidArgument, "egress resolver: Config.Lookup is required")
	}
	return serveListener(ctx, ln, r.serveTCPConn)
}

func (r *Resolver) serveTCPConn(ctx context.Context, c net.Conn) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	src := addrOf(c.RemoteAddr())
	buf := make([]byte, 2+65535)
	for {
		c.SetDeadline(time.Now().Add(dnsTCPIdle))
		if _, err := io.ReadFull(c, buf[:2]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(buf[:2]))
		if _, err := io.ReadFull(c, buf[2:2+n]); err != nil {
			return
		}
		q, resp := r.parse(src, buf[2:2+n])
		if q != nil && resp == nil {
			resp = r.resolve(ctx, q)
		}
		if resp == nil {
			return // not a DNS query: nothing sensible to say
		}
		out := make([]byte, 2, 2+len(resp))
		binary.BigEndian.PutUint16(out, uint16(len(resp)))
		if _, err := c.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

// parse reads a query and either answers it at once (resp != nil) or
// returns it for an upstream lookup (q != nil, resp == nil). Both nil
// means the message is not a query worth answering.
func (r *Resolver) parse(src netip.Addr, msg []byte) (q *dnsQuery, resp []byte) {
	var p dnsmessage.Parser
	hdr, err := p.Start(msg)
	if err != nil || hdr.Response {
		return nil, nil
	}
	qs, err := p.AllQuestions()
	q = &dnsQuery{hdr: hdr, d: Decision{Time: time.Now(), Proto: "dns", Port: 53}}
	if err != nil || len(qs) != 1 {
		return nil, r.reply(q, dnsmessage.RCodeFormatError, nil)
	}
	q.q = qs[0]
	q.d.Host = q.q.Name.String()
	if hdr.OpCode != 0 {
		q.d.Reason = "not a standard query"
		return nil, r.reply(q, dnsmessage.RCodeNotImplemented, nil)
	}
	id, pol, ok := r.cfg.Lookup(src)
	if !ok || pol == nil {
		q.d.Reason = "unknown source address"
		return nil, r.reply(q, dnsmessage.RCodeRefused, nil)
	}
	q.d.Sandbox = id
	name := normalizeName(q.d.Host)
	if name != "" {
		q.d.Host = name // logged as the proxy logs names: lowercase, no root dot
	}
	if name == "" || q.q.Class != dnsmessage.ClassINET || !pol.NameAllowed(name) {
		q.d.Reason = "name not allowed"
		if pol.Mode() == netpolicy.DenyAll {
			q.d.Reason = "policy is deny-all"
		}
		return nil, r.reply(q, dnsmessage.RCodeNameError, nil)
	}
	if q.q.Type != dnsmessage.TypeA {
		q.d.Allowed, q.d.Reason = true, "name allowed; only A records are answered"
		return nil, r.reply(q, dnsmessage.RCodeSuccess, nil)
	}
	return q, nil
}

// resolve looks an admitted name up upstream and answers with its IPv4
// addresses.
func (r *Resolver) resolve(ctx context.Context, q *dnsQuery) []byte {
	ctx, cancel := context.WithTimeout(ctx, dnsLookupTimeout)
	defer cancel()
	ips, err := r.cfg.LookupIP(ctx, q.d.Host)
	if err != nil {
		q.d.Reason = "upstream lookup failed"
		return r.reply(q, dnsmessage.RCodeServerFailure, nil)
	}
	v4 := make([]netip.Addr, 0, min(len(ips), dnsMaxAnswers))
	for _, ip := range ips {
		if ip = ip.Unmap(); ip.Is4() && len(v4) < dnsMaxAnswers {
			v4 = append(v4, ip)
		}
	}
	q.d.Allowed, q.d.Reason = true, "name allowed"
	if len(v4) > 0 {
		q.d.IP = v4[0]
	}
	return r.reply(q, dnsmessage.RCodeSuccess, v4)
}

// reply builds the answer to q, logs the decision and returns the
// message (nil only if building failed, which a parsed question cannot
// make happen).
func (r *Resolver) reply(q *dnsQuery, rcode dnsmessage.RCode, ips []netip.Addr) []byte {
	r.cfg.Log(q.d)
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), dnsmessage.Header{
		ID: q.hdr.ID, Response: true, OpCode: q.hdr.OpCode, RecursionDesired: q.hdr.RecursionDesired,
		RecursionAvailable: true, RCode: rcode,
	})
	b.EnableCompression()
	if q.q.Name.Length == 0 {
		if err := b.StartQuestions(); err != nil {
			return nil
		}
		out, _ := b.Finish()
		return out
	}
	if b.StartQuestions() != nil || b.Question(q.q) != nil || b.StartAnswers() != nil {
		return nil
	}
	for _, ip := range ips {
		rh := dnsmessage.ResourceHeader{Name: q.q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: r.cfg.DNSTTL}
		if b.AResource(rh, dnsmessage.AResource{A: ip.As4()}) != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}
