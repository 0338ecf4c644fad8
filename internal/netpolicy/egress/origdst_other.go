//go:build !linux

package egress

import (
	"net"
	"net/netip"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// OriginalDst needs netfilter's SO_ORIGINAL_DST, which only Linux has.
func OriginalDst(net.Conn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errdefs.New(errdefs.ErrNotImplemented, "original destination: needs Linux")
}
