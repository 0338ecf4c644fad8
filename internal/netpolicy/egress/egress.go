// Package egress is the userspace half of hutch's network policy: the
// transparent proxy every TCP connection of a sandbox is redirected to, the
// DNS resolver every port-53 query is redirected to, and the per-daemon CA
// that lets the proxy terminate TLS for hosts with credential rules.
//
// The proxy never trusts the address a sandbox connected to when a name is
// involved: it reads the name from the TLS ClientHello (SNI) or the HTTP
// Host, checks it against the sandbox's current netpolicy.Compiled, resolves
// it itself and dials the resolved address after checking it too. A
// connection without an allowed name goes out only if the policy admits its
// original address as such. Everything else is refused: the code fails
// closed wherever it cannot decide.
//
// The kernel half (the router namespace, the veths, the nftables rules that
// redirect traffic here) lives elsewhere; this package only needs a listener
// and a way to map a connection back to its sandbox and original address.
package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/netpolicy"
)

// Config is what the proxy and the resolver need from the daemon. Only
// Lookup is required; the rest have production defaults.
type Config struct {
	// Lookup maps a connection's source address to its sandbox and CURRENT
	// policy. It is called per connection and per query, so a live policy
	// change applies to the next one. ok=false refuses.
	Lookup func(src netip.Addr) (sandboxID string, pol *netpolicy.Compiled, ok bool)
	// OriginalDst returns where the sandbox meant to connect. Default:
	// SO_ORIGINAL_DST of the accepted *net.TCPConn (IPv4, set by the
	// nftables redirect).
	OriginalDst func(c net.Conn) (netip.AddrPort, error)
	// Dial makes outbound connections (the daemon may dial from another
	// network namespace). It only ever gets an IP literal and port that
	// have passed the policy check, and must connect to exactly that
	// address (no resolving, no redirecting). Default: a net.Dialer whose
	// Control hook checks the address once more right before connect.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// LookupIP resolves names upstream, for the proxy's own dials and for
	// the resolver's answers. Default: net.DefaultResolver.
	LookupIP func(ctx context.Context, host string) ([]netip.Addr, error)
	// Extra are always-denied ranges beyond the built-in ones (the host's
	// addresses, the sandboxes' subnet). It is called per decision.
	Extra func() []netip.Prefix
	// CA signs the leaf certificates of intercepted hosts. Without it a
	// host with a credential rule is refused rather than passed through
	// without its credentials.
	CA *CA
	// UpstreamRoots verify intercepted hosts' certificates; nil means the
	// system roots.
	UpstreamRoots *x509.CertPool
	// Log receives every decision. It must not block for long: it runs on
	// the connection's goroutine.
	Log func(Decision)

	// PeekTimeout bounds how long the proxy waits for a client's first
	// bytes (ClientHello or request head). Default 5s.
	PeekTimeout time.Duration
	// ServerFirstWait is how long the proxy waits for a client's first
	// bytes when the name cannot change the outcome (see Proxy). Default
	// 50ms.
	ServerFirstWait time.Duration
	// MaxConnsPerSandbox bounds the connections one sandbox has open
	// through the proxy at once; more are refused (default 1024).
	MaxConnsPerSandbox int
	// DNSTTL is the TTL of the resolver's answers, in seconds. Default 5:
	// short, so a policy change or an upstream change is seen soon.
	DNSTTL uint32
}

// Decision is one allow/deny decision, reported when the connection or
// query ends (so it carries the byte counts).
type Decision struct {
	Sandbox string
	Time    time.Time // when the connection was accepted / the query arrived
	// Proto is "tls" (a ClientHello was seen), "http" (an HTTP/1.x request
	// head), "tcp" (anything else, or nothing) or "dns".
	Proto string
	// Host is the name the client asked for (SNI, Host or DNS question),
	// empty if none.
	Host string
	// IP is the address dialed (or, for a refused connection, the original
	// destination; for DNS, the first address answered).
	IP          netip.Addr
	Port        int
	Allowed     bool
	Intercepted bool // TLS terminated / HTTP requests proxied one by one
	Reason      string
	BytesUp     int64 // client to upstream
	BytesDown   int64 // upstream to client
}

const (
	defaultPeekTimeout     = 5 * time.Second
	defaultServerFirstWait = 50 * time.Millisecond
	defaultDNSTTL          = 5
	dialTimeout            = 10 * time.Second
)

// withDefaults fills in the production defaults.
func (cfg Config) withDefaults() Config {
	if cfg.OriginalDst == nil {
		cfg.OriginalDst = OriginalDst
	}
	if cfg.LookupIP == nil {
		cfg.LookupIP = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	if cfg.Extra == nil {
		cfg.Extra = func() []netip.Prefix { return nil }
	}
	if cfg.Log == nil {
		cfg.Log = func(Decision) {}
	}
	if cfg.PeekTimeout <= 0 {
		cfg.PeekTimeout = defaultPeekTimeout
	}
	if cfg.ServerFirstWait <= 0 {
		cfg.ServerFirstWait = defaultServerFirstWait
	}
	if cfg.MaxConnsPerSandbox <= 0 {
		cfg.MaxConnsPerSandbox = 1024
	}
	if cfg.DNSTTL == 0 {
		cfg.DNSTTL = defaultDNSTTL
	}
	return cfg
}

// errRefused marks a connection the policy does not admit.
var errRefused = errdefs.ErrPermissionDenied

// dialName resolves name itself and dials the first resolved address that
// the policy lets it dial on port. It returns the address dialed.
func (p *Proxy) dialName(ctx context.Context, pol *netpolicy.Compiled, name string, port int) (net.Conn, netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	ips, err := p.cfg.LookupIP(ctx, name)
	if err != nil {
		return nil, netip.Addr{}, fmt.Errorf("resolve %s: %w: %v", name, errdefs.ErrUnavailable, err)
	}
	extra := p.cfg.Extra()
	var lastErr error
	for _, ip := range ips {
		ip = ip.Unmap()
		if !pol.DialAllowed(ip, port, extra) {
			continue
		}
		c, err := p.dialIP(ctx, pol, ip, port, extra)
		if err == nil {
			return c, ip, nil
		}
		lastErr = err
	}
	if lastErr != nil {
		return nil, netip.Addr{}, lastErr
	}
	return nil, netip.Addr{}, fmt.Errorf("%s resolves to no address the policy lets the proxy dial: %w", name, errRefused)
}

// dialIP dials ip:port, which the caller has checked. The default dialer
// checks it again in its Control hook, right before connect, so nothing
// between the check and the connect can change where it goes.
func (p *Proxy) dialIP(ctx context.Context, pol *netpolicy.Compiled, ip netip.Addr, port int, extra []netip.Prefix) (net.Conn, error) {
	addr := netip.AddrPortFrom(ip, uint16(port)).String()
	if p.cfg.Dial != nil {
		c, err := p.cfg.Dial(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w: %w", addr, errdefs.ErrUnavailable, err)
		}
		return c, nil
	}
	d := net.Dialer{Timeout: dialTimeout, Control: func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil || !pol.DialAllowed(ap.Addr(), int(ap.Port()), extra) {
			return fmt.Errorf("dial %s: %w", address, errRefused)
		}
		return nil
	}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w: %w", addr, errdefs.ErrUnavailable, err)
	}
	return c, nil
}

// validName reports whether s (lowercase, no trailing dot) is a DNS name
// the proxy is willing to resolve: LDH labels (plus '_'), at most 253
// bytes. Anything odd in an SNI or Host is treated as no name at all.
func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	label := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
			continue
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return false
		}
		label++
		if label > 63 {
			return false
		}
	}
	return label > 0
}

// normalizeName lowercases a name, strips a trailing dot and an optional
// :port, and returns "" unless the result is a valid DNS name.
func normalizeName(s string) string {
	if h, _, err := net.SplitHostPort(s); err == nil {
		s = h
	}
	s = toLower(s)
	if len(s) > 0 && s[len(s)-1] == '.' {
		s = s[:len(s)-1]
	}
	if !validName(s) {
		return ""
	}
	return s
}

// toLower avoids strings.ToLower's allocation for already-lowercase names,
// the common case.
func toLower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

func portString(port int) string { return strconv.Itoa(port) }

// isTimeout reports whether err is a deadline expiry.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
