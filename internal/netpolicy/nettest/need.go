package nettest

import (
	"os"
	"testing"

	"github.com/hutch-dev/hutch/internal/netpolicy/router"
)

// NeedNetworking skips t unless it runs as root on a host where sandbox
// networking can work (network namespaces, nftables), saying what is
// missing.
func NeedNetworking(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sandbox networking needs root (network namespaces, veth, nftables)")
	}
	if err := router.Probe(); err != nil {
		t.Skipf("sandbox networking is not available on this host: %v", err)
	}
}
