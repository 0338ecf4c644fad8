package netpolicy

import "net/netip"

// alwaysDenied are the ranges no sandbox reaches unless a CIDR rule names
// them: unspecified, private, shared (CGNAT), loopback, link-local (the
// cloud metadata address 169.254.169.254 among them), IETF protocol
// assignments, multicast, reserved and broadcast, and their IPv6
// counterparts.
var alwaysDenied = mustPrefixes(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
	"::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8", "64:ff9b:1::/48",
)

// AlwaysDenied reports whether ip is in a range no sandbox may reach by
// default: the built-in ones, or one of extra (the host's own addresses,
// the sandboxes' subnet).
func AlwaysDenied(ip netip.Addr, extra []netip.Prefix) bool {
	ip = ip.Unmap()
	if !ip.IsValid() {
		return true
	}
	for _, p := range alwaysDenied {
		if p.Contains(ip) {
			return true
		}
	}
	for _, p := range extra {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}
