// Package netpolicy is hutch's model of a sandbox's network policy: the
// modes (deny-all, allow-all, an allow list), the rules of an allow list
// (domain patterns, IPs and CIDRs with ports), the deny list that always
// wins, the ranges no sandbox may reach unless a rule names them, and the
// credential rules whose header values the daemon injects at egress.
//
// A Policy is what the API carries; Compile checks it and gives the
// Compiled form the enforcement parts (the egress proxy, the DNS resolver,
// the nftables rules) ask questions of. Compiled values are immutable, so a
// live policy change swaps one pointer and the next connection sees it.
package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Mode is a policy's overall stance.
type Mode string

// The modes.
const (
	// DenyAll gives the sandbox loopback only: no DNS, no route out.
	DenyAll Mode = "deny-all"
	// AllowAll lets TCP and DNS out, except to the always-denied ranges
	// (private, link-local with the metadata address, loopback, the host's
	// own addresses, other sandboxes) unless a rule names them.
	AllowAll Mode = "allow-all"
	// AllowList lets out exactly what the Allow rules name.
	AllowList Mode = "allow-list"
)

// DefaultHostPorts are the ports a host rule without ports admits.
var DefaultHostPorts = []int{80, 443}

// Policy is a sandbox's network policy as the API carries it.
type Policy struct {
	Mode  Mode   `json:"mode"`
	Allow []Rule `json:"allow,omitempty"`
	// Deny lists IPs or CIDRs that are refused whatever else says.
	Deny        []string     `json:"deny,omitempty"`
	Credentials []Credential `json:"credentials,omitempty"`
}

// Rule admits a host pattern or an address range, on some ports.
type Rule struct {
	// Host is a name ("api.github.com") or a pattern whose first label is
	// "*" ("*.npmjs.org": any name below npmjs.org, not npmjs.org itself).
	Host string `json:"host,omitempty"`
	// CIDR is an IP or a CIDR ("203.0.113.7", "198.51.100.0/24").
	CIDR string `json:"cidr,omitempty"`
	// Ports admitted; empty means 80 and 443 for a host and every port for
	// a CIDR.
	Ports []int `json:"ports,omitempty"`
}

// Credential adds or replaces headers on requests to a host. The values
// stay in the daemon; the API never returns them.
type Credential struct {
	Host    string            `json:"host"`
	Headers map[string]string `json:"headers"`
}

// Compiled is a checked, normalized policy. It is immutable.
type Compiled struct {
	mode  Mode
	hosts []hostRule
	cidrs []cidrRule
	deny  []netip.Prefix
	creds []credRule
	src   Policy
}

type hostRule struct {
	pattern string // lowercased; "*.x.y" or "x.y"
	ports   []int
}

type cidrRule struct {
	prefix netip.Prefix
	ports  []int // nil: every port
}

type credRule struct {
	pattern string
	headers map[string]string
}

// DenyAllPolicy is the default policy.
func DenyAllPolicy() *Compiled { return &Compiled{mode: DenyAll, src: Policy{Mode: DenyAll}} }

// Compile checks p and returns its compiled form, or an invalid_argument
// error naming the first thing wrong. An empty mode means deny-all.
func Compile(p Policy) (*Compiled, error) {
	c := &Compiled{mode: p.Mode}
	if c.mode == "" {
		c.mode = DenyAll
	}
	switch c.mode {
	case DenyAll, AllowAll, AllowList:
	default:
		return nil, invalid("network mode %q: want deny-all, allow-all or allow-list", p.Mode)
	}
	if len(p.Allow) > 1024 || len(p.Deny) > 1024 || len(p.Credentials) > 256 {
		return nil, invalid("network policy has too many rules (at most 1024 allow, 1024 deny, 256 credentials)")
	}
	for i, r := range p.Allow {
		if err := c.addRule(r); err != nil {
			return nil, fmt.Errorf("allow[%d]: %w", i, err)
		}
	}
	for i, d := range p.Deny {
		pfx, err := parsePrefix(d)
		if err != nil {
			return nil, fmt.Errorf("deny[%d]: %w", i, err)
		}
		c.deny = append(c.deny, pfx)
	}
	for i, cr := range p.Credentials {
		r, err := compileCred(cr)
		if err != nil {
			return nil, fmt.Errorf("credentials[%d]: %w", i, err)
		}
		c.creds = append(c.creds, r)
	}
	c.src = c.normalized(p)
	return c, nil
}

func (c *Compiled) addRule(r Rule) error {
	if (r.Host == "") == (r.CIDR == "") {
		return invalid("a rule names exactly one of host or cidr")
	}
	for _, p := range r.Ports {
		if p < 1 || p > 65535 {
			return invalid("port %d is out of range 1-65535", p)
		}
	}
	ports := slices.Clone(r.Ports)
	slices.Sort(ports)
	ports = slices.Compact(ports)
	if r.CIDR != "" {
		pfx, err := parsePrefix(r.CIDR)
		if err != nil {
			return err
		}
		c.cidrs = append(c.cidrs, cidrRule{prefix: pfx, ports: ports})
		return nil
	}
	if _, err := netip.ParseAddr(r.Host); err == nil {
		return invalid("host %q is an IP address: use cidr", r.Host)
	}
	pat, err := normalizePattern(r.Host)
	if err != nil {
		return err
	}
	if len(ports) == 0 {
		ports = DefaultHostPorts
	}
	c.hosts = append(c.hosts, hostRule{pattern: pat, ports: ports})
	return nil
}

func compileCred(cr Credential) (credRule, error) {
	pat, err := normalizePattern(cr.Host)
	if err != nil {
		return credRule{}, err
	}
	if len(cr.Headers) == 0 {
		return credRule{}, invalid("credential for %q has no headers", cr.Host)
	}
	h := make(map[string]string, len(cr.Headers))
	for k, v := range cr.Headers {
		if !validHeaderName(k) {
			return credRule{}, invalid("header name %q is not a valid HTTP token", k)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return credRule{}, invalid("header %q: value has a line break or NUL", k)
		}
		h[k] = v
	}
	return credRule{pattern: pat, headers: h}, nil
}

// normalized is p with defaults made explicit and names lowercased, as the
// API reports it back (credential values included: callers redact).
func (c *Compiled) normalized(p Policy) Policy {
	out := Policy{Mode: c.mode, Deny: make([]string, 0, len(c.deny))}
	for _, r := range p.Allow {
		n := Rule{Host: strings.ToLower(strings.TrimSuffix(r.Host, ".")), Ports: slices.Clone(r.Ports)}
		if r.CIDR != "" {
			pfx, _ := parsePrefix(r.CIDR)
			n.CIDR = pfx.String()
		}
		slices.Sort(n.Ports)
		n.Ports = slices.Compact(n.Ports)
		out.Allow = append(out.Allow, n)
	}
	for _, d := range c.deny {
		out.Deny = append(out.Deny, d.String())
	}
	for _, cr := range c.creds {
		out.Credentials = append(out.Credentials, Credential{Host: cr.pattern, Headers: cr.headers})
	}
	return out
}

// Mode is the policy's mode.
func (c *Compiled) Mode() Mode { return c.mode }

// Policy returns the normalized policy, credential values included.
func (c *Compiled) Policy() Policy { return c.src }

// Redacted returns the normalized policy with every credential header value
// replaced by "[redacted]", as the API shows it.
func (c *Compiled) Redacted() Policy {
	p := c.src
	p.Credentials = nil
	for _, cr := range c.src.Credentials {
		h := make(map[string]string, len(cr.Headers))
		for k := range cr.Headers {
			h[k] = "[redacted]"
		}
		p.Credentials = append(p.Credentials, Credential{Host: cr.Host, Headers: h})
	}
	return p
}

// Networked reports whether the sandbox needs a network interface at all.
func (c *Compiled) Networked() bool { return c.mode != DenyAll }

// HostAllowed reports whether a connection to host:port by name is allowed.
// The caller still checks, with DialAllowed, every address it dials for it.
func (c *Compiled) HostAllowed(host string, port int) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "" || c.mode == DenyAll {
		return false
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return false // an address is not a name: IPAllowed decides
	}
	if c.mode == AllowAll {
		return true
	}
	for _, r := range c.hosts {
		if matchPattern(r.pattern, host) && slices.Contains(r.ports, port) {
			return true
		}
	}
	return false
}

// NameAllowed reports whether some rule admits host on any port: the DNS
// resolver answers exactly these names.
func (c *Compiled) NameAllowed(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	switch c.mode {
	case DenyAll:
		return false
	case AllowAll:
		return host != ""
	}
	for _, r := range c.hosts {
		if matchPattern(r.pattern, host) {
			return true
		}
	}
	return false
}

// IPAllowed reports whether a connection to ip:port with no allowed name
// (a direct-IP connection, or one whose name no rule admits) may go out.
// extra are the always-denied ranges of this host (its own addresses, the
// sandboxes' subnet) beyond the built-in ones.
func (c *Compiled) IPAllowed(ip netip.Addr, port int, extra []netip.Prefix) bool {
	ip = ip.Unmap()
	if c.mode == DenyAll || c.denied(ip) {
		return false
	}
	if c.ruleAdmits(ip, port) {
		return true
	}
	return c.mode == AllowAll && !AlwaysDenied(ip, extra)
}

// DialAllowed reports whether the proxy may dial ip:port for a name that
// HostAllowed admitted: the deny list wins, and the always-denied ranges
// stay denied (an allowed name that resolves to the metadata address or to
// the host gains nothing) unless a CIDR rule names the address.
func (c *Compiled) DialAllowed(ip netip.Addr, port int, extra []netip.Prefix) bool {
	ip = ip.Unmap()
	if c.mode == DenyAll || c.denied(ip) {
		return false
	}
	return !AlwaysDenied(ip, extra) || c.ruleAdmits(ip, port)
}

func (c *Compiled) denied(ip netip.Addr) bool {
	for _, d := range c.deny {
		if d.Contains(ip) {
			return true
		}
	}
	return false
}

func (c *Compiled) ruleAdmits(ip netip.Addr, port int) bool {
	for _, r := range c.cidrs {
		if r.prefix.Contains(ip) && (r.ports == nil || slices.Contains(r.ports, port)) {
			return true
		}
	}
	return false
}

// Credentials returns the headers to add or replace on requests to host,
// or nil when no credential rule matches it.
func (c *Compiled) Credentials(host string) map[string]string {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, r := range c.creds {
		if matchPattern(r.pattern, host) {
			return r.headers
		}
	}
	return nil
}

// Intercepts reports whether the proxy terminates TLS for host: only hosts
// with credential rules are intercepted.
func (c *Compiled) Intercepts(host string) bool { return c.Credentials(host) != nil }

// SecretValues returns every credential header value, so a proxy can make
// sure none of them is echoed back to the sandbox.
func (c *Compiled) SecretValues() []string {
	var out []string
	for _, r := range c.creds {
		for _, v := range r.headers {
			if v != "" {
				out = append(out, v)
			}
		}
	}
	return out
}

func matchPattern(pattern, host string) bool {
	if rest, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(host, "."+rest) && len(host) > len(rest)+1
	}
	return pattern == host
}

func normalizePattern(h string) (string, error) {
	h = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(h), "."))
	if h == "" {
		return "", invalid("empty host")
	}
	if len(h) > 253 {
		return "", invalid("host %q is longer than 253 characters", h)
	}
	labels := strings.Split(h, ".")
	for i, l := range labels {
		if l == "*" && i == 0 && len(labels) > 2 {
			continue
		}
		if l == "*" {
			return "", invalid("host %q: a wildcard is only allowed as the first of three or more labels", h)
		}
		if !validLabel(l) {
			return "", invalid("host %q: %q is not a valid DNS label", h, l)
		}
	}
	return h, nil
}

func validLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for _, r := range l {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if r > 126 || r <= 32 || strings.ContainsRune("\"(),/:;<=>?@[\\]{}", r) {
			return false
		}
	}
	return true
}

func parsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, invalid("%q is not an IP or CIDR", s)
	}
	return p.Masked(), nil
}

func invalid(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalidArgument, format, args...)
}

// Event is one egress decision, as a sandbox's log and the API show it.
type Event struct {
	Time      time.Time `json:"time"`
	Proto     string    `json:"proto"` // tls, http, tcp or dns
	Host      string    `json:"host,omitempty"`
	IP        string    `json:"ip,omitempty"`
	Port      int       `json:"port"`
	Allowed   bool      `json:"allowed"`
	Reason    string    `json:"reason,omitempty"`
	BytesUp   int64     `json:"bytes_up,omitempty"`
	BytesDown int64     `json:"bytes_down,omitempty"`
}
