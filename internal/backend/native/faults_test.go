package native_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/backend/backendtest"
	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// assertNothingLeft checks that a failed create left no directory, cgroup
// or running init, and that a bystander sandbox still works.
func assertNothingLeft(t *testing.T, b *native.Backend, dataDir, id, bystander string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", id)); err == nil {
		t.Errorf("a failed create left its directory")
	}
	if _, err := b.Inspect(context.Background(), id); !errorsIs(err, errdefs.ErrNotFound) {
		t.Errorf("a failed create is still known: %v", err)
	}
	if out := backendtest.Sh(t, b, bystander, "echo ok"); out != "ok\n" {
		t.Errorf("bystander: %q", out)
	}
}

func TestFailedMountLeavesNothing(t *testing.T) {
	requireRoot(t)
	dir := traversableTempDir(t)
	b := newBackend(t, dir)
	bystander := backendtest.NewID("by")
	backendtest.Create(t, b, backend.Spec{ID: bystander})
	// procfs supports no idmapped mounts: the layer cannot be prepared.
	id := backendtest.NewID("badmnt")
	_, err := b.Create(context.Background(), backend.Spec{ID: id, Base: "dir:/proc/sys"})
	backendtest.WantErr(t, "base on a filesystem without idmapped mounts", err, errdefs.ErrFailedPrecondition)
	assertNothingLeft(t, b, dir, id, bystander)
	// A file is no root filesystem.
	_, err = b.Create(context.Background(), backend.Spec{ID: id, Base: "dir:/etc/hostname"})
	backendtest.WantErr(t, "file as base", err, errdefs.ErrInvalidArgument)
	_, err = b.Create(context.Background(), backend.Spec{ID: id, Base: "oci:/no/such/image.tar"})
	backendtest.WantErr(t, "missing image", err, errdefs.ErrNotFound)
	assertNothingLeft(t, b, dir, id, bystander)
}

func TestUIDRangesExhausted(t *testing.T) {
	requireRoot(t)
	dir := traversableTempDir(t)
	b := newBackendOpts(t, native.Options{DataDir: dir, Slots: 2, WarmInits: -1, UIDBase: 1<<30 + 1<<28})
	first := backendtest.NewID("slot")
	backendtest.Create(t, b, backend.Spec{ID: first})
	backendtest.Create(t, b, backend.Spec{ID: backendtest.NewID("slot")})
	id := backendtest.NewID("slot")
	_, err := b.Create(context.Background(), backend.Spec{ID: id})
	backendtest.WantErr(t, "third sandbox on two uid ranges", err, errdefs.ErrResourceExhausted)
	assertNothingLeft(t, b, dir, id, first)
	// Destroying one frees its range for the next.
	if err := b.Destroy(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	backendtest.Create(t, b, backend.Spec{ID: id})
	backendtest.Sh(t, b, id, "true")
}

func TestEachSandboxHasItsOwnUIDRange(t *testing.T) {
	requireRoot(t)
	b := newBackend(t, traversableTempDir(t))
	seen := map[string]string{}
	for range 3 {
		id := backendtest.NewID("range")
		backendtest.Create(t, b, backend.Spec{ID: id})
		m := strings.Fields(backendtest.Sh(t, b, id, "cat /proc/self/uid_map"))
		if other, dup := seen[m[1]]; dup {
			t.Fatalf("%s and %s share host uid range %s", id, other, m[1])
		}
		seen[m[1]] = id
	}
}

func TestCPULimitIsWritten(t *testing.T) {
	requireRoot(t)
	b := newBackend(t, traversableTempDir(t))
	id := backendtest.NewID("cpu")
	backendtest.Create(t, b, backend.Spec{ID: id, Limits: backend.Limits{CPUMillis: 250, MemoryBytes: 128 << 20, Pids: 64}})
	info, err := b.Inspect(context.Background(), id)
	if err != nil || info.Cgroup == "" {
		t.Fatalf("inspect: %+v %v", info, err)
	}
	want := map[string]string{"cpu": "25000", "memory": strconv.Itoa(128 << 20), "pids": "64"}
	files := map[string]string{"cpu": "cpu.cfs_quota_us", "memory": "memory.limit_in_bytes", "pids": "pids.max"}
	for ctrl, file := range files {
		p := findCgroupIn("/sys/fs/cgroup/"+ctrl, info.Cgroup)
		if p == "" {
			t.Skipf("no v1 %s hierarchy with the sandbox's group (v2 host?)", ctrl)
		}
		got, _ := os.ReadFile(filepath.Join(p, file))
		if strings.TrimSpace(string(got)) != want[ctrl] {
			t.Errorf("%s/%s = %q, want %s", ctrl, file, got, want[ctrl])
		}
	}
}
