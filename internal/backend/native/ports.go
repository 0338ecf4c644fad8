package native

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/vishvananda/netns"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/netpolicy/router"
)

var _ backend.PortDialer = (*Backend)(nil)

// DialPort implements backend.PortDialer: the socket is made inside the
// sandbox's network namespace and connects to its loopback (IPv4, then
// IPv6), where a server bound to localhost listens too.
func (b *Backend) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "port %d is out of range 1-65535", port)
	}
	s, err := b.running(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	pid := s.state.Pid
	s.mu.Unlock()
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s network namespace: %v: %w", id, err, errdefs.ErrUnavailable)
	}
	defer ns.Close()
	var c net.Conn
	err = router.InNS(ns, func() error {
		var d net.Dialer
		var derr error
		for _, host := range []string{"127.0.0.1", "::1"} {
			if c, derr = d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port))); derr == nil {
				return nil
			}
		}
		return derr
	})
	if err != nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "nothing answers on port %d of sandbox %s: %v", port, id, err)
	}
	return c, nil
}
