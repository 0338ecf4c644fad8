package egress

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// OriginalDst returns the address a redirected IPv4 TCP connection was
// originally sent to, from the netfilter conntrack entry
// (getsockopt SOL_IP SO_ORIGINAL_DST), without cgo.
//
// The kernel writes a struct sockaddr_in (16 bytes) and refuses a shorter
// buffer. x/sys/unix has no getsockopt for a sockaddr, so this borrows
// GetsockoptIPv6Mreq, whose 20-byte buffer is large enough and which goes
// through the right syscall on every architecture (socketcall on 386).
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errdefs.New(errdefs.ErrInvalidArgument, "original destination: %T is not a TCP connection", c)
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	var mreq *unix.IPv6Mreq
	var serr error
	if err := rc.Control(func(fd uintptr) {
		mreq, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	}); err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w: %w", errdefs.ErrUnavailable, serr)
	}
	// sockaddr_in: family (host order), port (network order), address.
	raw := mreq.Multiaddr[:]
	if binary.NativeEndian.Uint16(raw[0:2]) != unix.AF_INET {
		return netip.AddrPort{}, errdefs.New(errdefs.ErrUnavailable, "original destination: not an IPv4 address")
	}
	port := binary.BigEndian.Uint16(raw[2:4])
	ip := netip.AddrFrom4([4]byte(raw[4:8]))
	return netip.AddrPortFrom(ip, port), nil
}
