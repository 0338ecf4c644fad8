package native_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/backend/backendtest"
	"github.com/hutch-dev/hutch/internal/backend/native"
)

func TestMain(m *testing.M) {
	if native.IsInit() {
		native.InitMain()
	}
	os.Exit(m.Run())
}

// requireRoot skips a test that needs root and the kernel features the
// native backend uses.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the native backend needs root (uid ranges, idmapped mounts, cgroups)")
	}
}

// traversableTempDir is a temp dir an unprivileged uid can walk into.
func traversableTempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func newBackend(t testing.TB, dir string) *native.Backend {
	t.Helper()
	return newBackendOpts(t, native.Options{DataDir: dir})
}

func newBackendOpts(t testing.TB, opts native.Options) *native.Backend {
	t.Helper()
	b, err := native.New(opts)
	if err != nil {
		t.Fatalf("native.New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func harness(t *testing.T) backendtest.Harness {
	dirs := map[backend.Backend]string{}
	marker := filepath.Join(traversableTempDir(t), "host-secret.txt")
	if err := os.WriteFile(marker, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := backendtest.Harness{
		HostMarker: marker,
		LayerDir:   func(t *testing.T) string { return traversableTempDir(t) },
		New: func(t *testing.T) backend.Backend {
			dir := traversableTempDir(t)
			b := newBackend(t, dir)
			dirs[b] = dir
			return b
		},
		Reopen: func(t *testing.T, old backend.Backend) backend.Backend {
			// The old instance still runs here, with its own warm pool,
			// which a restarted daemon would not have.
			b := newBackendOpts(t, native.Options{DataDir: dirs[old], WarmInits: -1})
			dirs[b] = dirs[old]
			return b
		},
		Leaks: func(t *testing.T, b backend.Backend, id string, info backend.Info) []string {
			return leaks(dirs[b], id, info)
		},
		KillInit: func(t *testing.T, b backend.Backend, info backend.Info) {
			if err := syscall.Kill(info.Pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		},
	}
	if rootfs, err := busyboxRootfs(t); err != nil {
		t.Logf("no directory or OCI base test: %v", err)
	} else {
		h.ExtraBases = append(h.ExtraBases, "dir:"+rootfs)
		if img, err := ociTarball(t, rootfs); err != nil {
			t.Logf("no OCI base test: %v", err)
		} else {
			h.ExtraBases = append(h.ExtraBases, "oci:"+img)
		}
	}
	return h
}

func TestConformance(t *testing.T) {
	requireRoot(t)
	backendtest.Run(t, harness(t))
}

// leaks lists what a destroyed sandbox left on the host.
func leaks(dataDir, id string, info backend.Info) []string {
	var out []string
	sbx := filepath.Join(dataDir, "sandboxes", id)
	if _, err := os.Stat(sbx); err == nil {
		out = append(out, "directory "+sbx)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, sbx) {
			out = append(out, "mount "+line)
		}
	}
	if cg := findCgroup(info.Cgroup); info.Cgroup != "" && cg != "" {
		out = append(out, "cgroup "+cg)
	}
	if info.Pid > 0 {
		if _, err := os.Stat("/proc/" + strconv.Itoa(info.Pid)); err == nil {
			if comm, _ := os.ReadFile("/proc/" + strconv.Itoa(info.Pid) + "/cmdline"); strings.Contains(string(comm), "__hutch_init") {
				out = append(out, fmt.Sprintf("init process %d", info.Pid))
			}
		}
	}
	return out
}

// findCgroup walks the v1 memory and pids hierarchies for a group named id.
func findCgroup(id string) string {
	if id == "" {
		return ""
	}
	for _, root := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified"} {
		if found := findCgroupIn(root, id); found != "" {
			return found
		}
	}
	return ""
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }

// findCgroupIn walks one hierarchy for a group named id.
func findCgroupIn(root, id string) string {
	{
		found := ""
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if d.Name() == id {
				found = p
				return filepath.SkipAll
			}
			return nil
		})
		return found
	}
}

// busyboxRootfs builds a minimal root filesystem directory from the host's
// static busybox, as a stand-in for a debootstrap'd tree.
func busyboxRootfs(t *testing.T) (string, error) {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return "", fmt.Errorf("busybox is not installed (apt-get install busybox-static)")
	}
	if out, _ := exec.Command("file", bb).Output(); len(out) > 0 && !strings.Contains(string(out), "static") {
		return "", fmt.Errorf("%s is not statically linked", bb)
	}
	root := filepath.Join(traversableTempDir(t), "rootfs")
	for _, d := range []string{"bin", "etc", "proc", "sys", "dev", "tmp", "root", "workspace"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), data, 0o755); err != nil {
		return "", err
	}
	list, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return "", err
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet != "busybox" {
			os.Symlink("busybox", filepath.Join(root, "bin", applet))
		}
	}
	os.Symlink("bin", filepath.Join(root, "usr"))
	files := map[string]string{"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n", "etc/group": "root:x:0:\n"}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	return root, nil
}

func TestHostBaseHidesHostSecrets(t *testing.T) {
	requireRoot(t)
	b := newBackend(t, traversableTempDir(t))
	id := backendtest.NewID("secrets")
	backendtest.Create(t, b, backend.Spec{ID: id})
	out := backendtest.Sh(t, b, id, "ls -A /home /root /var /run /tmp | tr '\\n' ' '; cat /etc/shadow")
	if strings.Contains(out, "$") {
		t.Fatalf("a password hash is visible: %q", out)
	}
	hostShadow, _ := os.ReadFile("/etc/shadow")
	if len(hostShadow) > 0 && strings.Contains(out, strings.SplitN(string(hostShadow), "\n", 2)[0]) && strings.Contains(string(hostShadow), "$") {
		t.Fatalf("the host's /etc/shadow is visible")
	}
	r := backendtest.Exec(t, b, id, backend.ExecRequest{Cmd: "touch /usr/bin/evil"})
	if r.Exit.Code == 0 {
		t.Fatal("the host's /usr is writable from the sandbox")
	}
	if _, err := os.Stat("/usr/bin/evil"); err == nil {
		os.Remove("/usr/bin/evil")
		t.Fatal("a sandbox wrote into the host's /usr")
	}
}

func TestSecurityReport(t *testing.T) {
	requireRoot(t)
	b := newBackend(t, traversableTempDir(t))
	id := backendtest.NewID("sec")
	h := backendtest.Create(t, b, backend.Spec{ID: id})
	if !strings.Contains(string(h.State), `"seccomp":true`) || !strings.Contains(string(h.State), `"no_new_privs":true`) {
		t.Fatalf("handle state lacks the confinement report: %s", h.State)
	}
	_ = context.Background()
}
