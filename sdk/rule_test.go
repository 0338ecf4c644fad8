package hutch_test

import (
	"errors"
	"reflect"
	"testing"

	hutch "github.com/hutch-dev/hutch/sdk"
)

func TestParseNetworkRule(t *testing.T) {
	for in, want := range map[string]hutch.NetworkRule{
		"api.github.com":          {Host: "api.github.com"},
		"*.npmjs.org:443":         {Host: "*.npmjs.org", Ports: []int{443}},
		"db.example:5432,6432":    {Host: "db.example", Ports: []int{5432, 6432}},
		"203.0.113.7":             {CIDR: "203.0.113.7"},
		"198.51.100.0/24:22":      {CIDR: "198.51.100.0/24", Ports: []int{22}},
		"2001:db8::1":             {CIDR: "2001:db8::1"},
		"2001:db8::/32":           {CIDR: "2001:db8::/32"},
		"[2001:db8::/32]:443,80":  {CIDR: "2001:db8::/32", Ports: []int{443, 80}},
		"localhost.example:8080 ": {Host: "localhost.example", Ports: []int{8080}},
	} {
		got, err := hutch.ParseNetworkRule(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("ParseNetworkRule(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", ":443", "a.example:", "a.example:http", "a.example:0", "a.example:65536",
		"[2001:db8::1", "[2001:db8::1]x"} {
		_, err := hutch.ParseNetworkRule(in)
		var re *hutch.RuleError
		if !errors.As(err, &re) || !errors.Is(err, hutch.ErrInvalidArgument) || re.Rule != in {
			t.Errorf("ParseNetworkRule(%q): %v, want a RuleError matching ErrInvalidArgument", in, err)
		}
	}
}
