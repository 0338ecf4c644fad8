package hutch

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/hutch-dev/hutch/api"
)

// Networking: every sandbox has a network policy, deny-all (loopback only)
// unless it was created with another or given one since. A daemon running
// without networking refuses any other mode with ErrFailedPrecondition. A
// sandbox port can also be exposed through the daemon, for HTTP and
// WebSocket, whatever its policy.

// NetworkMode is a network policy's overall stance.
type NetworkMode string

// The network modes.
const (
	// NetworkDenyAll gives the sandbox loopback only: no DNS, no route out.
	NetworkDenyAll NetworkMode = "deny-all"
	// NetworkAllowAll lets TCP and DNS out, except to private, link-local
	// (the metadata address), loopback, the host's own addresses and other
	// sandboxes, unless a CIDR rule names them.
	NetworkAllowAll NetworkMode = "allow-all"
	// NetworkAllowList lets out exactly what the Allow rules name.
	NetworkAllowList NetworkMode = "allow-list"
)

// RedactedValue is what the daemon shows in place of every credential
// header value: the values it keeps are never sent back.
const RedactedValue = "[redacted]"

// NetworkPolicy is a sandbox's network policy.
type NetworkPolicy struct {
	Mode  NetworkMode   `json:"mode"` // "" means deny-all
	Allow []NetworkRule `json:"allow,omitempty"`
	// Deny lists IPs or CIDRs refused whatever else says.
	Deny []string `json:"deny,omitempty"`
	// Credentials are headers added to (or replaced on) HTTP(S) requests
	// to a host on their way out; the sandbox never sees the values, and
	// the daemon answers them as RedactedValue.
	Credentials []NetworkCredential `json:"credentials,omitempty"`
}

// NetworkRule admits a host or an address range (exactly one of the two)
// on some ports.
type NetworkRule struct {
	// Host is a name ("api.github.com") or a pattern "*.npmjs.org" (names
	// below npmjs.org, not npmjs.org itself).
	Host string `json:"host,omitempty"`
	// CIDR is an IP or a CIDR ("203.0.113.7", "198.51.100.0/24").
	CIDR string `json:"cidr,omitempty"`
	// Ports admitted; empty means 80 and 443 for a host and every port for
	// a CIDR.
	Ports []int `json:"ports,omitempty"`
}

// NetworkCredential adds or replaces headers on requests to Host (a name
// or a *. pattern).
type NetworkCredential struct {
	Host    string            `json:"host"`
	Headers map[string]string `json:"headers"`
}

// NetworkEvent is one egress decision: a connection or a DNS query.
type NetworkEvent struct {
	Time      time.Time `json:"time"`
	Proto     string    `json:"proto"` // tls, http, tcp or dns
	Host      string    `json:"host,omitempty"`
	IP        string    `json:"ip,omitempty"`
	Port      int       `json:"port"`
	Allowed   bool      `json:"allowed"`
	Reason    string    `json:"reason,omitempty"`
	BytesUp   int64     `json:"bytes_up,omitempty"` // from the sandbox
	BytesDown int64     `json:"bytes_down,omitempty"`
}

func toAPIPolicy(p NetworkPolicy) api.NetworkPolicy {
	out := api.NetworkPolicy{Mode: api.NetworkPolicyMode(p.Mode), Deny: p.Deny}
	for _, r := range p.Allow {
		out.Allow = append(out.Allow, api.NetworkRule{Host: r.Host, Cidr: r.CIDR, Ports: r.Ports})
	}
	for _, c := range p.Credentials {
		out.Credentials = append(out.Credentials, api.NetworkCredential{Host: c.Host, Headers: c.Headers})
	}
	return out
}

func fromAPIPolicy(p api.NetworkPolicy) *NetworkPolicy {
	out := &NetworkPolicy{Mode: NetworkMode(p.Mode), Deny: p.Deny}
	for _, r := range p.Allow {
		out.Allow = append(out.Allow, NetworkRule{Host: r.Host, CIDR: r.Cidr, Ports: r.Ports})
	}
	for _, c := range p.Credentials {
		out.Credentials = append(out.Credentials, NetworkCredential{Host: c.Host, Headers: c.Headers})
	}
	return out
}

// Network returns sandbox id's network policy, credential values shown as
// RedactedValue.
func (c *Client) Network(ctx context.Context, id string) (*NetworkPolicy, error) {
	r, err := c.api.GetNetworkWithResponse(ctx, id)
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	p, err := must(r.JSON200)
	if err != nil {
		return nil, err
	}
	return fromAPIPolicy(*p), nil
}

// SetNetwork replaces sandbox id's network policy live (new connections
// follow it at once; a suspended sandbox gets it when it resumes) and
// returns the policy now in force, normalized and redacted. A mode other
// than deny-all on a daemon without networking is ErrFailedPrecondition.
func (c *Client) SetNetwork(ctx context.Context, id string, p NetworkPolicy) (*NetworkPolicy, error) {
	r, err := c.api.SetNetworkWithResponse(ctx, id, toAPIPolicy(p))
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	out, err := must(r.JSON200)
	if err != nil {
		return nil, err
	}
	return fromAPIPolicy(*out), nil
}

// NetworkEvents returns sandbox id's most recent egress decisions (up to
// 256), oldest first.
func (c *Client) NetworkEvents(ctx context.Context, id string) ([]NetworkEvent, error) {
	r, err := c.api.NetworkEventsWithResponse(ctx, id)
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	list, err := must(r.JSON200)
	if err != nil {
		return nil, err
	}
	out := make([]NetworkEvent, 0, len(list.Events))
	for _, e := range list.Events {
		out = append(out, NetworkEvent{Time: e.Time, Proto: e.Proto, Host: e.Host, IP: e.Ip, Port: e.Port,
			Allowed: e.Allowed, Reason: e.Reason, BytesUp: e.BytesUp, BytesDown: e.BytesDown})
	}
	return out, nil
}

// Network returns the sandbox's network policy (see Client.Network).
func (s *Sandbox) Network(ctx context.Context) (*NetworkPolicy, error) { return s.c.Network(ctx, s.ID) }

// SetNetwork replaces the sandbox's network policy (see Client.SetNetwork).
func (s *Sandbox) SetNetwork(ctx context.Context, p NetworkPolicy) (*NetworkPolicy, error) {
	return s.c.SetNetwork(ctx, s.ID, p)
}

// NetworkEvents returns the sandbox's recent egress decisions.
func (s *Sandbox) NetworkEvents(ctx context.Context) ([]NetworkEvent, error) {
	return s.c.NetworkEvents(ctx, s.ID)
}

// PortTokenHeader is the header that carries an exposed port's token.
const PortTokenHeader = "X-Hutch-Port-Token"

// ExposedPort is a sandbox port reachable through the daemon. Requests to
// it need an API key of the sandbox's tenant, the local socket, or Token
// (in the PortTokenHeader header, or the hutch_port_token query
// parameter), unless it is Public.
type ExposedPort struct {
	SandboxID string `json:"sandbox_id"`
	Port      int    `json:"port"`
	Public    bool   `json:"public"`
	Token     string `json:"token,omitempty"`
	// Path is where the daemon serves it: /v1/sandboxes/{id}/ports/{port}/
	// on the daemon's host.
	Path string `json:"path"`
	// URL is http://{port}-{id}.{domain}/ when the daemon has a domain.
	URL string `json:"url,omitempty"`
}

func fromAPIPort(id string, p api.ExposedPort) ExposedPort {
	return ExposedPort{SandboxID: id, Port: p.Port, Public: p.Public, Token: p.Token, Path: p.Path, URL: p.Url}
}

// ExposePort exposes port (1-65535, TCP; the server may listen on
// 127.0.0.1) of sandbox id through the daemon, with a new token; public
// ports need no key or token. Exposing a port again replaces its setting
// and token.
func (c *Client) ExposePort(ctx context.Context, id string, port int, public bool) (*ExposedPort, error) {
	r, err := c.api.ExposePortWithResponse(ctx, id, api.ExposePortRequest{Port: port, Public: public})
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	p, err := must(r.JSON200)
	if err != nil {
		return nil, err
	}
	ep := fromAPIPort(id, *p)
	return &ep, nil
}

// Ports lists sandbox id's exposed ports, tokens included.
func (c *Client) Ports(ctx context.Context, id string) ([]ExposedPort, error) {
	r, err := c.api.ListPortsWithResponse(ctx, id)
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	list, err := must(r.JSON200)
	if err != nil {
		return nil, err
	}
	out := make([]ExposedPort, 0, len(list.Ports))
	for _, p := range list.Ports {
		out = append(out, fromAPIPort(id, p))
	}
	return out, nil
}

// UnexposePort stops exposing port of sandbox id; a port not exposed is no
// error.
func (c *Client) UnexposePort(ctx context.Context, id string, port int) error {
	r, err := c.api.UnexposePortWithResponse(ctx, id, port)
	return c.check(r, err)
}

// ExposePort exposes a port of the sandbox (see Client.ExposePort).
func (s *Sandbox) ExposePort(ctx context.Context, port int, public bool) (*ExposedPort, error) {
	return s.c.ExposePort(ctx, s.ID, port, public)
}

// Ports lists the sandbox's exposed ports.
func (s *Sandbox) Ports(ctx context.Context) ([]ExposedPort, error) { return s.c.Ports(ctx, s.ID) }

// UnexposePort stops exposing a port of the sandbox.
func (s *Sandbox) UnexposePort(ctx context.Context, port int) error {
	return s.c.UnexposePort(ctx, s.ID, port)
}

// PortURL returns the URL of an exposed port through this client's daemon
// (by path, so it needs no DNS for the daemon's domain); a request to
// PortURL(p)+"x" reaches /x on the sandbox's port. On a unix socket host
// the URL's host is a placeholder: use it with PortClient's client.
func (c *Client) PortURL(p ExposedPort) string {
	return strings.TrimSuffix(c.base, "/v1/") + p.Path
}

// PortClient returns an HTTP client and PortURL(p): the client reaches the
// daemon as this Client does (over its socket, say) and sends p's token in
// the PortTokenHeader header on requests to the daemon's host, never to
// another host a redirect leads to. The sandbox's server sees neither the
// token nor an API key, so its own Authorization headers pass through.
func (c *Client) PortClient(p ExposedPort) (*http.Client, string) {
	base := c.PortURL(p)
	next := c.http.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	host := ""
	if i := strings.Index(base, "://"); i >= 0 {
		host, _, _ = strings.Cut(base[i+3:], "/")
	}
	return &http.Client{Transport: &portTransport{next: next, host: host, token: p.Token}, Timeout: c.http.Timeout}, base
}

// portTransport adds an exposed port's token to requests to the daemon.
type portTransport struct {
	next  http.RoundTripper
	host  string
	token string
}

func (t *portTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.token == "" || r.URL.Host != t.host || r.Header.Get(PortTokenHeader) != "" {
		return t.next.RoundTrip(r)
	}
	r = r.Clone(r.Context()) // a RoundTripper must not change the caller's request
	r.Header.Set(PortTokenHeader, t.token)
	return t.next.RoundTrip(r)
}

// RuleError says what is wrong with the short form of a rule
// (ParseNetworkRule). It matches ErrInvalidArgument.
type RuleError struct {
	Rule    string // the text given
	Problem string
}

func (e *RuleError) Error() string { return fmt.Sprintf("%q: %s", e.Rule, e.Problem) }

// Unwrap makes a RuleError an ErrInvalidArgument.
func (e *RuleError) Unwrap() error { return ErrInvalidArgument }

// ParseNetworkRule reads the short form of an allow rule, as the CLI's
// --allow and the MCP tools take it: HOST[:PORT,...] (a name or *.domain;
// without ports 80 and 443) or IP/CIDR[:PORT,...] (without ports, every
// port); an IPv6 address or CIDR with ports is written [IPv6/CIDR]:PORTS.
// The daemon checks the rest (label syntax, ranges) when the policy is set.
func ParseNetworkRule(s string) (NetworkRule, error) {
	fail := func(problem string) (NetworkRule, error) { return NetworkRule{}, &RuleError{Rule: s, Problem: problem} }
	target, ports := s, ""
	if !isAddrOrCIDR(s) { // a bare IPv6 address has colons of its own
		if rest, ok := strings.CutPrefix(s, "["); ok {
			var found bool
			if target, ports, found = strings.Cut(rest, "]"); !found || (ports != "" && ports[0] != ':') {
				return fail("want [IPv6/CIDR]:PORTS")
			}
			ports = strings.TrimPrefix(ports, ":")
		} else if i := strings.LastIndexByte(s, ':'); i >= 0 {
			target, ports = s[:i], s[i+1:]
		}
	}
	if target == "" {
		return fail("want HOST[:PORT,...] or CIDR[:PORT,...]")
	}
	r := NetworkRule{Host: target}
	if isAddrOrCIDR(target) {
		r = NetworkRule{CIDR: target}
	}
	if ports == "" && strings.HasSuffix(s, ":") {
		return fail("no port after the colon")
	}
	if ports != "" {
		for p := range strings.SplitSeq(ports, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil || n < 1 || n > 65535 {
				return fail(fmt.Sprintf("port %q: want a number 1-65535", p))
			}
			r.Ports = append(r.Ports, n)
		}
	}
	return r, nil
}

func isAddrOrCIDR(s string) bool {
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	_, err := netip.ParsePrefix(s)
	return err == nil
}
