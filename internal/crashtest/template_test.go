package crashtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKillDuringTemplateBuild: the daemon dies at several moments of a
// template build (while its setup runs, while its layer is frozen and
// copied). The next daemon leaves no build sandbox, temporary layer or
// init behind, and the template still builds and works.
func TestKillDuringTemplateBuild(t *testing.T) {
	r := newRig(t)
	d := r.start()
	recipe := map[string]any{
		"setup": []string{"mkdir -p /opt/tool && head -c 20000000 /dev/urandom > /opt/tool/blob",
			"sleep 0.2; echo built > /opt/tool/marker"},
	}
	d.call("PUT", "/v1/templates/app", recipe, 200, nil)
	for _, delay := range []time.Duration{20 * time.Millisecond, 150 * time.Millisecond, 350 * time.Millisecond} {
		answer := d.asyncJSON("POST", "/v1/templates/app/build", nil)
		// The build must really be under way when the daemon dies.
		waitFor(t, "the build sandbox to appear", 10*time.Second, func() bool {
			return len(buildLeftovers(r.data)) > 0
		})
		time.Sleep(delay)
		r.crash()
		<-answer
		d = r.start()
		waitFor(t, "build sandboxes and temporary layers to be cleaned up", 10*time.Second, func() bool {
			return len(buildLeftovers(r.data)) == 0
		})
	}
	d.call("POST", "/v1/sandboxes", map[string]any{"id": "tmpl", "template": "app", "idle_timeout": -1}, 201, nil)
	if got := d.sh("tmpl", "cat /opt/tool/marker; stat -c %s /opt/tool/blob"); got != "built\n20000000\n" {
		t.Fatalf("a sandbox from the template after the crashes: %q", got)
	}
	if left := buildLeftovers(r.data); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
	r.stop()
	r.verify()
}

// buildLeftovers lists what an interrupted build may leave: build
// sandboxes' directories and temporary layer directories.
func buildLeftovers(data string) []string {
	var out []string
	sbs, _ := os.ReadDir(filepath.Join(data, "sandboxes"))
	for _, e := range sbs {
		if strings.HasPrefix(e.Name(), "bld-") {
			out = append(out, "sandbox "+e.Name())
		}
	}
	layers, _ := os.ReadDir(filepath.Join(data, "layers"))
	for _, e := range layers {
		if strings.HasPrefix(e.Name(), ".tmp") {
			out = append(out, "layer "+e.Name())
		}
	}
	return out
}
