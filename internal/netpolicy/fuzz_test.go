package netpolicy

import (
	"encoding/json"
	"errors"
	"net/netip"
	"testing"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// FuzzCompile: any JSON policy either compiles or is refused with
// invalid_argument, never a panic; a compiled one survives a round trip
// through its normalized form unchanged, redacts every credential value,
// and never admits an always-denied address without a rule naming it.
func FuzzCompile(f *testing.F) {
	for _, seed := range []string{
		`{"mode":"allow-list","allow":[{"host":"api.github.com"},{"host":"*.npmjs.org","ports":[443]},{"cidr":"198.51.100.0/24","ports":[5432]}],"deny":["198.51.100.66"]}`,
		`{"mode":"allow-all","deny":["10.0.0.0/8"],"credentials":[{"host":"api.example.com","headers":{"Authorization":"Bearer x"}}]}`,
		`{"mode":"deny-all"}`, `{}`, `{"mode":"allow-list","allow":[{"host":"a.*.b"}]}`,
		`{"mode":"allow-list","allow":[{"cidr":"::ffff:10.0.0.1"}]}`, `{"allow":[{"host":"x","cidr":"1.2.3.4"}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var p Policy
		if json.Unmarshal(raw, &p) != nil {
			return
		}
		c, err := Compile(p)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("refused with %v, want invalid_argument", err)
			}
			return
		}
		again, err := Compile(c.Policy())
		if err != nil {
			t.Fatalf("the normalized form does not compile: %v", err)
		}
		a, _ := json.Marshal(c.Policy())
		b, _ := json.Marshal(again.Policy())
		if string(a) != string(b) {
			t.Fatalf("normalizing twice differs:\n%s\n%s", a, b)
		}
		for _, cr := range c.Redacted().Credentials {
			for k, v := range cr.Headers {
				if v != "[redacted]" {
					t.Fatalf("header %s shown as %q", k, v)
				}
			}
		}
		for _, s := range []string{"169.254.169.254", "127.0.0.1", "10.1.2.3", "::1", "fe80::1"} {
			ip := netip.MustParseAddr(s)
			if c.IPAllowed(ip, 80, nil) && !c.ruleAdmits(ip, 80) {
				t.Fatalf("%s admitted without a rule naming it", s)
			}
		}
	})
}
