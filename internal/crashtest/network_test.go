package crashtest

import (
	"strings"
	"testing"

	"github.com/hutch-dev/hutch/internal/netpolicy/nettest"
)

// TestNetworkAfterKill: a daemon killed with SIGKILL takes its router
// namespace (and every veth into the sandboxes) with it; the next daemon
// must give each running sandbox its link back, with its policy, and keep
// deny-all ones without any.
func TestNetworkAfterKill(t *testing.T) {
	r := newRig(t)
	nettest.NeedNetworking(t)
	d := r.start("--network", "on")
	d.call("POST", "/v1/sandboxes", map[string]any{"id": "net-open", "idle_timeout": -1,
		"network": map[string]any{"mode": "allow-list", "allow": []map[string]any{{"host": "example.test"}}}}, 201, nil)
	d.create("net-closed")
	addr := func(d *daemon) string {
		return strings.TrimSpace(d.sh("net-open", "busybox ip -4 -o addr show eth0 | busybox awk '{print $4}'"))
	}
	before := addr(d)
	if before == "" {
		t.Fatal("the networked sandbox has no address")
	}
	d.kill()
	d = r.start("--network", "on")
	if got := addr(d); got == "" {
		t.Fatalf("after kill -9 and a new daemon, the networked sandbox has no eth0 address (had %s)", before)
	}
	if route := d.sh("net-open", "busybox ip -4 route show default"); !strings.Contains(route, "default via") {
		t.Fatalf("no default route after the restart: %q", route)
	}
	if ifs := d.sh("net-closed", "ls /sys/class/net"); strings.TrimSpace(ifs) != "lo" {
		t.Fatalf("the deny-all sandbox got interfaces: %q", ifs)
	}
	var pol struct {
		Mode  string `json:"mode"`
		Allow []struct {
			Host string `json:"host"`
		} `json:"allow"`
	}
	d.call("GET", "/v1/sandboxes/net-open/network", nil, 200, &pol)
	if pol.Mode != "allow-list" || len(pol.Allow) != 1 || pol.Allow[0].Host != "example.test" {
		t.Fatalf("policy after the restart: %+v", pol)
	}
}
