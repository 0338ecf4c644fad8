package e2b

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/netpolicy"
)

func TestE2BPolicy(t *testing.T) {
	no, yes := false, true
	cases := []struct {
		name      string
		internet  *bool
		network   string
		networked bool
		want      netpolicy.Policy
	}{
		{"default, networking on", nil, ``, true, netpolicy.Policy{Mode: netpolicy.AllowAll}},
		{"default, networking off", nil, ``, false, netpolicy.Policy{Mode: netpolicy.DenyAll}},
		{"no internet", &no, ``, true, netpolicy.Policy{Mode: netpolicy.DenyAll}},
		{"internet", &yes, ``, true, netpolicy.Policy{Mode: netpolicy.AllowAll}},
		{"deny all", nil, `{"denyOut":["0.0.0.0/0"]}`, true, netpolicy.Policy{Mode: netpolicy.DenyAll}},
		{"allow list", nil, `{"allowOut":["a.example","*.b.example","1.2.3.4","10.0.0.0/8"],"denyOut":["0.0.0.0/0","5.6.7.8"]}`, true,
			netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{Host: "a.example"}, {Host: "*.b.example"},
				{CIDR: "1.2.3.4"}, {CIDR: "10.0.0.0/8"}}}},
		{"no internet but allowOut", &no, `{"allowOut":["a.example"]}`, true,
			netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{Host: "a.example"}}}},
		{"deny some", nil, `{"denyOut":["5.6.7.0/24"]}`, true, netpolicy.Policy{Mode: netpolicy.AllowAll, Deny: []string{"5.6.7.0/24"}}},
		{"rules", nil, `{"allowOut":["api.x.example"],"denyOut":["0.0.0.0/0"],"rules":{"api.x.example":[{"transform":{"headers":{"Authorization":"Bearer k"}}}]}}`, true,
			netpolicy.Policy{Mode: netpolicy.AllowList, Allow: []netpolicy.Rule{{Host: "api.x.example"}},
				Credentials: []netpolicy.Credential{{Host: "api.x.example", Headers: map[string]string{"Authorization": "Bearer k"}}}}},
	}
	for _, c := range cases {
		got, err := policyOfJSON(c.internet, c.network, c.networked)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !reflect.DeepEqual(*got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, *got, c.want)
		}
	}
	for raw, want := range map[string]error{
		`{"egressProxy":{"address":"p:1080"}}`: errdefs.ErrNotImplemented,
		`{"httpsPorts":[8443]}`:                errdefs.ErrNotImplemented,
		`{"denyOut":["evil.example"]}`:         errdefs.ErrInvalidArgument,
		`{"allowOut":"x"}`:                     errdefs.ErrInvalidArgument,
	} {
		if _, err := policyOfJSON(nil, raw, true); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", raw, err, want)
		}
	}
}

// policyOfJSON is what create does with its body's network object.
func policyOfJSON(internet *bool, network string, networked bool) (*netpolicy.Policy, error) {
	cfg, err := parseNetwork(json.RawMessage(network))
	if err != nil {
		return nil, err
	}
	return e2bPolicy(internet, cfg, networked)
}
