package netpolicy

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

func mustCompile(t *testing.T, p Policy) *Compiled {
	t.Helper()
	c, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCompileRejects(t *testing.T) {
	bad := map[string]Policy{
		"mode":          {Mode: "open"},
		"both":          {Mode: AllowList, Allow: []Rule{{Host: "a.com", CIDR: "1.2.3.4"}}},
		"neither":       {Mode: AllowList, Allow: []Rule{{}}},
		"port 0":        {Mode: AllowList, Allow: []Rule{{Host: "a.com", Ports: []int{0}}}},
		"port big":      {Mode: AllowList, Allow: []Rule{{Host: "a.com", Ports: []int{65536}}}},
		"ip as host":    {Mode: AllowList, Allow: []Rule{{Host: "1.2.3.4"}}},
		"bad cidr":      {Mode: AllowList, Allow: []Rule{{CIDR: "1.2.3.0/33"}}},
		"mid wildcard":  {Mode: AllowList, Allow: []Rule{{Host: "a.*.com"}}},
		"tld wildcard":  {Mode: AllowList, Allow: []Rule{{Host: "*.com"}}},
		"bad label":     {Mode: AllowList, Allow: []Rule{{Host: "a b.com"}}},
		"deny":          {Mode: AllowAll, Deny: []string{"nope"}},
		"cred nohdr":    {Mode: AllowAll, Credentials: []Credential{{Host: "a.com"}}},
		"cred hdr name": {Mode: AllowAll, Credentials: []Credential{{Host: "a.com", Headers: map[string]string{"a b": "x"}}}},
		"cred crlf":     {Mode: AllowAll, Credentials: []Credential{{Host: "a.com", Headers: map[string]string{"X": "a\r\nB: c"}}}},
	}
	for name, p := range bad {
		if _, err := Compile(p); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want invalid_argument", name, err)
		}
	}
}

func TestAllowList(t *testing.T) {
	c := mustCompile(t, Policy{Mode: AllowList,
		Allow: []Rule{{Host: "API.github.com."}, {Host: "*.npmjs.org", Ports: []int{443}},
			{CIDR: "198.51.100.0/24", Ports: []int{5432}}, {CIDR: "10.9.8.7"}},
		Deny: []string{"198.51.100.66"}})
	cases := []struct {
		host string
		port int
		want bool
	}{
		{"api.github.com", 443, true}, {"api.github.com", 80, true}, {"api.github.com", 22, false},
		{"github.com", 443, false}, {"registry.npmjs.org", 443, true}, {"a.b.npmjs.org", 443, true},
		{"npmjs.org", 443, false}, {"registry.npmjs.org", 80, false}, {"evilnpmjs.org", 443, false},
		{"1.2.3.4", 443, false}, {"", 443, false},
	}
	for _, tc := range cases {
		if got := c.HostAllowed(tc.host, tc.port); got != tc.want {
			t.Errorf("HostAllowed(%q, %d) = %v", tc.host, tc.port, got)
		}
	}
	ip := netip.MustParseAddr
	if !c.IPAllowed(ip("198.51.100.5"), 5432, nil) || c.IPAllowed(ip("198.51.100.5"), 5433, nil) {
		t.Error("cidr rule ports")
	}
	if c.IPAllowed(ip("198.51.100.66"), 5432, nil) {
		t.Error("deny list must win over an allow rule")
	}
	if !c.IPAllowed(ip("10.9.8.7"), 1, nil) {
		t.Error("an explicit rule admits a private address")
	}
	if c.IPAllowed(ip("203.0.113.9"), 443, nil) {
		t.Error("allow-list admitted an unlisted address")
	}
	if !c.DialAllowed(ip("203.0.113.9"), 443, nil) || c.DialAllowed(ip("169.254.169.254"), 80, nil) ||
		c.DialAllowed(ip("127.0.0.1"), 443, nil) || c.DialAllowed(ip("::ffff:10.0.0.1"), 443, nil) {
		t.Error("DialAllowed ranges")
	}
	if !c.NameAllowed("x.npmjs.org") || c.NameAllowed("evil.com") {
		t.Error("NameAllowed")
	}
}

func TestAllowAllAndDenyAll(t *testing.T) {
	ip := netip.MustParseAddr
	host := []netip.Prefix{netip.MustParsePrefix("203.0.113.1/32")}
	a := mustCompile(t, Policy{Mode: AllowAll, Deny: []string{"198.18.0.0/15"}})
	for _, s := range []string{"169.254.169.254", "127.0.0.1", "10.1.2.3", "192.168.1.1", "172.20.0.1",
		"100.64.0.1", "fe80::1", "::1", "198.18.0.5", "203.0.113.1"} {
		if a.IPAllowed(ip(s), 80, host) {
			t.Errorf("allow-all admitted %s", s)
		}
	}
	if !a.IPAllowed(ip("203.0.113.2"), 80, host) || !a.HostAllowed("anything.example", 8080) {
		t.Error("allow-all refused a public address")
	}
	d := DenyAllPolicy()
	if d.HostAllowed("a.com", 443) || d.IPAllowed(ip("203.0.113.2"), 80, nil) || d.NameAllowed("a.com") || d.Networked() {
		t.Error("deny-all admitted something")
	}
	if c, _ := Compile(Policy{}); c.Mode() != DenyAll {
		t.Error("empty mode is not deny-all")
	}
}

func TestCredentialsRedacted(t *testing.T) {
	c := mustCompile(t, Policy{Mode: AllowList, Allow: []Rule{{Host: "api.example.com"}},
		Credentials: []Credential{{Host: "API.example.com", Headers: map[string]string{"Authorization": "Bearer s3cret"}}}})
	if got := c.Credentials("api.example.com")["Authorization"]; got != "Bearer s3cret" {
		t.Fatalf("credentials = %q", got)
	}
	if c.Credentials("other.example.com") != nil || !c.Intercepts("api.example.com") || c.Intercepts("x.com") {
		t.Error("credential matching")
	}
	r := c.Redacted()
	if r.Credentials[0].Headers["Authorization"] != "[redacted]" || r.Credentials[0].Host != "api.example.com" {
		t.Errorf("redacted = %+v", r)
	}
	if c.Policy().Credentials[0].Headers["Authorization"] != "Bearer s3cret" {
		t.Error("Policy lost the value")
	}
	if v := c.SecretValues(); len(v) != 1 || v[0] != "Bearer s3cret" {
		t.Errorf("secrets = %v", v)
	}
}
