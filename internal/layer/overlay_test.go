package layer

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOverlayRoundTrip checks the archive against overlayfs itself: an
// upper holding a whiteout and an opaque directory (userxattr format,
// made by hand) is mounted over a lower, changed through the mount (so the
// kernel adds its own whiteouts, shared-inode ones, and opaque
// directories), packed, unpacked into a new upper and mounted again; the
// merged views must be identical.
func TestOverlayRoundTrip(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	p := func(rel string) string { return filepath.Join(root, rel) }
	for _, d := range []string{"L/d", "L/sub", "L/redo", "U/d", "U/sub", "W", "W2", "U2", "M", "M2"} {
		must(t, os.MkdirAll(p(d), 0o755))
	}
	files := map[string]string{
		"L/keep.txt": "lower", "L/gone.txt": "deleted above", "L/d/old.txt": "hidden by opaque",
		"L/sub/a.txt": "merged a", "L/rm1": "1", "L/rm2": "2", "L/redo/x": "x", "U/new.txt": "upper", "U/d/new.txt": "inside opaque", "U/sub/b.txt": "merged b",
	}
	for rel, body := range files {
		must(t, os.WriteFile(p(rel), []byte(body), 0o644))
	}
	must(t, unix.Mknod(p("U/gone.txt"), unix.S_IFCHR, 0))
	must(t, unix.Setxattr(p("U/d"), "user.overlay.opaque", []byte("y"), 0))

	mountOverlay(t, p("L"), p("U"), p("W"), p("M"))
	must(t, os.Remove(p("M/rm1")))
	must(t, os.Remove(p("M/rm2")))
	must(t, os.RemoveAll(p("M/redo")))
	must(t, os.Mkdir(p("M/redo"), 0o700)) // opaque, made by the kernel
	must(t, os.WriteFile(p("M/redo/y"), []byte("y"), 0o644))
	must(t, os.WriteFile(p("M/sub/a.txt"), []byte("copied up"), 0o644))
	want := snapshot(t, p("M"), 0)
	for _, rel := range []string{"gone.txt", "d/old.txt", "rm1", "rm2", "redo/x"} {
		if _, ok := want[rel]; ok {
			t.Fatalf("overlay shows %s: the hand-made userxattr metadata was not honoured", rel)
		}
	}
	for _, rel := range []string{"keep.txt", "new.txt", "d/new.txt", "sub/a.txt", "sub/b.txt", "redo/y"} {
		if _, ok := want[rel]; !ok {
			t.Fatalf("overlay misses %s", rel)
		}
	}
	unmount(t, p("M"))

	var buf bytes.Buffer
	st, err := Pack(context.Background(), &buf, p("U"), 0, idRange)
	must(t, err)
	if st.Whiteouts != 3 {
		t.Errorf("stats %+v: want 3 whiteouts", st)
	}
	_, err = Unpack(context.Background(), &buf, p("U2"), 0, idRange, 1<<20)
	must(t, err)
	mountOverlay(t, p("L"), p("U2"), p("W2"), p("M2"))
	sameTree(t, want, snapshot(t, p("M2"), 0))
}

// mountOverlay mounts lower+upper on target with userxattr, as a sandbox's
// init does (here from the host's namespace, which root may do too), and
// unmounts it when the test ends.
func mountOverlay(t *testing.T, lower, upper, work, target string) {
	t.Helper()
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + ",userxattr"
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		t.Skipf("cannot mount overlay with userxattr here (%v); skipping the overlayfs check", err)
	}
	t.Cleanup(func() { unmount(t, target) })
}

func unmount(t *testing.T, target string) {
	if err := unix.Unmount(target, 0); err != nil && err != unix.EINVAL {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
			t.Errorf("unmount %s: %v", target, err)
		}
	}
}
