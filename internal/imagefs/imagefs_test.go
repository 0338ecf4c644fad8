package imagefs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

var testConfig = v1.Config{
	Env:        []string{"PATH=/usr/bin:/bin", "HOME=/home/user"},
	WorkingDir: "/home/user",
	Entrypoint: []string{"/bin/sh", "-c"},
	Cmd:        []string{"echo hi"},
	User:       "1000:1000",
}

// richImage exercises every kind of entry and the whiteout rules.
func richImage(t testing.TB) v1.Image {
	base := layer(t,
		dir("./", 0o755, 0),
		dir("etc/", 0o755, 0),
		file("etc/hostname", "box\n", 0o644, 0),
		dir("bin/", 0o755, 0),
		file("bin/busybox", "#!busybox", 0o755, 0),
		symlink("bin/sh", "busybox"),
		hardlink("bin/ls", "bin/busybox"),
		file("bin/su", "su", 0o4755, 0),
		file("bin/wall", "wall", 0o2755, 0),
		dir("home/user/", 0o750, 1000),
		file("home/user/notes", "mine", 0o600, 1000),
		dir("tmp/", 0o1777, 0),
		file("tmp/gone", "bye", 0o644, 0),
		dir("opaque/", 0o755, 0),
		file("opaque/old", "old", 0o644, 0),
		dir("opaque/sub/", 0o755, 0),
		file("opaque/sub/old2", "old", 0o644, 0),
		file("becomes-dir", "a file for now", 0o644, 0),
		dir("becomes-file/", 0o755, 0),
		file("becomes-file/child", "x", 0o644, 0),
		special("run/fifo", tar.TypeFifo, 0o620),
		special("dev/null", tar.TypeChar, 0o666),
		special("dev/sda", tar.TypeBlock, 0o660),
	)
	upper := layer(t,
		whiteout("tmp/.wh.gone"),
		dir("opaque/", 0o755, 0),
		whiteout("opaque/.wh..wh..opq"),
		file("opaque/new", "new", 0o644, 0),
		dir("becomes-dir/", 0o700, 0),
		file("becomes-dir/inside", "in", 0o644, 0),
		file("becomes-file", "now a file", 0o644, 0),
		hardlink("usr/bin/ls", "bin/busybox"), // across layers, implicit parents
		symlink("lib", "usr/lib"),
		dir("usr/lib/", 0o755, 0),
		file("lib/libc.so", "libc", 0o755, 0), // through an in-tree symlink
		symlink("bin/abs", "/etc/hostname"),   // absolute target is fine: never followed
	)
	return image(t, testConfig, base, upper)
}

func checkRich(t *testing.T, root string) {
	t.Helper()
	if got := readFile(t, filepath.Join(root, "etc/hostname")); got != "box\n" {
		t.Errorf("etc/hostname = %q", got)
	}
	modes := map[string]os.FileMode{
		".":                  0o755 | os.ModeDir,
		"bin/su":             0o755 | os.ModeSetuid,
		"bin/wall":           0o755 | os.ModeSetgid,
		"tmp":                0o777 | os.ModeDir | os.ModeSticky,
		"home/user":          0o750 | os.ModeDir,
		"home/user/notes":    0o600,
		"run/fifo":           0o620 | os.ModeNamedPipe,
		"becomes-dir":        0o700 | os.ModeDir,
		"becomes-file":       0o644,
		"usr/bin":            0o755 | os.ModeDir,
		"bin/sh":             0o777 | os.ModeSymlink,
		"lib":                0o777 | os.ModeSymlink,
		"usr/lib/libc.so":    0o755,
		"becomes-dir/inside": 0o644,
	}
	for p, want := range modes {
		if got := lstat(t, filepath.Join(root, p)).Mode(); got != want {
			t.Errorf("%s: mode %v, want %v", p, got, want)
		}
	}
	for p, uid := range map[string]uint32{"home/user": 1000, "home/user/notes": 1000, "bin/su": 0} {
		st := lstat(t, filepath.Join(root, p)).Sys().(*syscall.Stat_t)
		if st.Uid != uid || st.Gid != uid {
			t.Errorf("%s: owner %d:%d, want %d:%d", p, st.Uid, st.Gid, uid, uid)
		}
	}
	for _, p := range []string{"bin/sh", "bin/abs", "lib"} {
		if _, err := os.Readlink(filepath.Join(root, p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	if got, _ := os.Readlink(filepath.Join(root, "bin/abs")); got != "/etc/hostname" {
		t.Errorf("bin/abs -> %q", got)
	}
	bb := lstat(t, filepath.Join(root, "bin/busybox"))
	for _, p := range []string{"bin/ls", "usr/bin/ls"} {
		if !os.SameFile(bb, lstat(t, filepath.Join(root, p))) {
			t.Errorf("%s is not a hard link of bin/busybox", p)
		}
	}
	for _, p := range []string{"tmp/gone", "opaque/old", "opaque/sub", "dev/null", "dev/sda", "becomes-file/child"} {
		assertMissing(t, filepath.Join(root, p))
	}
	if got := readFile(t, filepath.Join(root, "opaque/new")); got != "new" {
		t.Errorf("opaque/new = %q", got)
	}
	for _, p := range []string{"etc/hostname", "etc", "home/user", "bin/sh", "tmp", "."} {
		if mt := lstat(t, filepath.Join(root, p)).ModTime(); !mt.Equal(epoch) {
			t.Errorf("%s: mtime %v, want %v", p, mt, epoch)
		}
	}
}

func TestUnpackDockerTarball(t *testing.T) {
	requireRoot(t)
	img := richImage(t)
	src := writeTarball(t, map[string]v1.Image{"example.com/rich:1": img})
	for _, ref := range []string{"", "example.com/rich:1", configDigest(t, img)} {
		t.Run(fmt.Sprintf("ref=%q", ref), func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "rootfs")
			got, err := Unpack(context.Background(), src, ref, dst)
			if err != nil {
				t.Fatal(err)
			}
			want := Image{
				Digest: configDigest(t, img), Env: testConfig.Env, WorkingDir: testConfig.WorkingDir,
				Entrypoint: testConfig.Entrypoint, Cmd: testConfig.Cmd, User: testConfig.User,
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Unpack = %+v, want %+v", got, want)
			}
			checkRich(t, dst)
		})
	}
}

func TestUnpackOCILayout(t *testing.T) {
	requireRoot(t)
	img := richImage(t)
	src := writeLayout(t, map[string]v1.Image{"busybox:latest": img})
	manifest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"", "busybox:latest", "busybox", "docker.io/library/busybox:latest", manifest.String(), configDigest(t, img)} {
		t.Run(fmt.Sprintf("ref=%q", ref), func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "rootfs")
			got, err := Unpack(context.Background(), src, ref, dst)
			if err != nil {
				t.Fatal(err)
			}
			if got.Digest != configDigest(t, img) || got.WorkingDir != "/home/user" {
				t.Errorf("Unpack = %+v", got)
			}
			checkRich(t, dst)
		})
	}
}

// twoImages returns two distinguishable single-file images.
func twoImages(t testing.TB) (a, b v1.Image) {
	a = image(t, v1.Config{Cmd: []string{"a"}}, layer(t, file("which", "a", 0o644, 0)))
	b = image(t, v1.Config{Cmd: []string{"b"}}, layer(t, file("which", "b", 0o644, 0)))
	return a, b
}

func TestMultiImage(t *testing.T) {
	requireRoot(t)
	a, b := twoImages(t)
	imgs := map[string]v1.Image{"example.com/a:1": a, "b:latest": b}
	sources := map[string]string{"tarball": writeTarball(t, imgs), "layout": writeLayout(t, imgs)}
	for kind, src := range sources {
		t.Run(kind, func(t *testing.T) {
			for ref, want := range map[string]string{
				"example.com/a:1": "a", "b:latest": "b", "b": "b",
				configDigest(t, a): "a", configDigest(t, b): "b",
			} {
				dst := filepath.Join(t.TempDir(), "rootfs")
				if _, err := Unpack(context.Background(), src, ref, dst); err != nil {
					t.Fatalf("ref %q: %v", ref, err)
				}
				if got := readFile(t, filepath.Join(dst, "which")); got != want {
					t.Errorf("ref %q unpacked image %q, want %q", ref, got, want)
				}
			}
			dst := filepath.Join(t.TempDir(), "rootfs")
			_, err := Unpack(context.Background(), src, "", dst)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("empty ref with two images: err = %v, want ErrInvalidArgument", err)
			}
			t.Logf("empty ref: %v", err)
			_, err = Unpack(context.Background(), src, "nope:1", dst)
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("unknown ref: err = %v, want ErrNotFound", err)
			}
			assertMissing(t, dst)
		})
	}
}

func TestUnpackErrors(t *testing.T) {
	requireRoot(t)
	a, _ := twoImages(t)
	src := writeTarball(t, map[string]v1.Image{"a:1": a})
	ctx := context.Background()

	_, err := Unpack(ctx, filepath.Join(t.TempDir(), "missing.tar"), "", filepath.Join(t.TempDir(), "d"))
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing src: %v, want ErrNotFound", err)
	}

	exists := t.TempDir()
	if _, err := Unpack(ctx, src, "", exists); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("existing dst: %v, want ErrAlreadyExists", err)
	}

	junk := filepath.Join(t.TempDir(), "junk.tar")
	if err := os.WriteFile(junk, []byte("not a tarball"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Unpack(ctx, junk, "", filepath.Join(t.TempDir(), "d")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("junk src: %v, want ErrInvalidArgument", err)
	}
	if _, err := Unpack(ctx, t.TempDir(), "", filepath.Join(t.TempDir(), "d")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("plain dir src: %v, want ErrInvalidArgument", err)
	}

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	dst := filepath.Join(t.TempDir(), "d")
	if _, err := Unpack(canceled, src, "", dst); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: %v, want context.Canceled", err)
	}
	assertMissing(t, dst)
}

// TestUnsafeEntries: every hostile layer fails with ErrInvalidArgument,
// leaves no dst and writes nothing outside it.
func TestUnsafeEntries(t *testing.T) {
	requireRoot(t)
	hostTmp := filepath.Join(os.TempDir(), fmt.Sprintf("hutch-pwned-%d", os.Getpid()))
	hostRel := hostTmp[1:] // the same path, relative to a root
	cases := map[string][]ent{
		"dotdot":            {file("../x", "x", 0o644, 0)},
		"dotdot-inner":      {dir("a/", 0o755, 0), file("a/../../x", "x", 0o644, 0)},
		"absolute":          {file("/abs", "x", 0o644, 0)},
		"symlink-to-root":   {symlink("evil", "/"), file("evil/"+hostRel, "pwned", 0o644, 0)},
		"symlink-dotdot":    {symlink("up", "../../../../../../.."), file("up/"+hostRel, "pwned", 0o644, 0)},
		"symlink-dir-write": {symlink("evil", "/"), dir("evil/"+hostRel+"/", 0o755, 0)},
		"symlink-hardlink":  {symlink("evil", "/"), hardlink("passwd", "evil/etc/passwd")},
		"hardlink-abs":      {hardlink("passwd", "/etc/passwd")},
		"hardlink-dotdot":   {hardlink("passwd", "../../../../../../../etc/passwd")},
		"hardlink-missing":  {hardlink("x", "nothing/here")},
		"whiteout-evil":     {symlink("evil", "/"), whiteout("evil/" + hostRel + "/.wh.x")},
		"opaque-evil":       {symlink("evil", "/"), whiteout("evil/" + hostRel + "/.wh..wh..opq")},
	}
	for name, ents := range cases {
		t.Run(name, func(t *testing.T) {
			img := image(t, v1.Config{}, layer(t, ents...))
			src := writeTarball(t, map[string]v1.Image{"evil:1": img})
			parent := t.TempDir()
			dst := filepath.Join(parent, "rootfs")
			_, err := Unpack(context.Background(), src, "", dst)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("err = %v, want ErrInvalidArgument", err)
			}
			t.Logf("%v", err)
			assertMissing(t, dst)
			assertMissing(t, hostTmp)
			if ents, _ := os.ReadDir(parent); len(ents) != 0 {
				t.Errorf("left %v beside dst", ents)
			}
		})
	}
}

// TestLargeImage unpacks ~2000 files over several layers.
func TestLargeImage(t *testing.T) {
	requireRoot(t)
	var layers []v1.Layer
	n := 0
	for l := range 4 {
		var ents []ent
		for d := range 10 {
			for f := range 50 {
				ents = append(ents, file(fmt.Sprintf("usr/share/l%d/d%d/f%d", l, d, f), fmt.Sprint(n), 0o644, 0))
				n++
			}
		}
		layers = append(layers, layer(t, ents...))
	}
	src := writeTarball(t, map[string]v1.Image{"big:1": image(t, v1.Config{}, layers...)})
	dst := filepath.Join(t.TempDir(), "rootfs")
	if _, err := Unpack(context.Background(), src, "", dst); err != nil {
		t.Fatal(err)
	}
	count := 0
	err := filepath.WalkDir(dst, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			count++
		}
		return err
	})
	if err != nil || count != n {
		t.Fatalf("found %d files (err %v), want %d", count, err, n)
	}
}

// TestWhiteoutsHideLowerLayersOnly: a whiteout or opaque marker that comes
// after entries of its own layer keeps those entries.
func TestWhiteoutsHideLowerLayersOnly(t *testing.T) {
	requireRoot(t)
	lower := layer(t,
		file("d/old", "old", 0o644, 0),
		file("x/old", "old", 0o644, 0),
		file("./dotted", "lower", 0o644, 0),
	)
	upper := layer(t,
		file("d/new", "new", 0o644, 0),
		dir("d/sub/", 0o755, 0),
		whiteout("d/.wh..wh..opq"),
		dir("x/", 0o755, 0),
		file("x/new", "new", 0o644, 0),
		whiteout(".wh.x"),
		file("dotted", "upper", 0o644, 0),
		whiteout(".wh.never-existed"),
		whiteout("no/such/dir/.wh.y"),
	)
	src := writeTarball(t, map[string]v1.Image{"w:1": image(t, v1.Config{}, lower, upper)})
	dst := filepath.Join(t.TempDir(), "rootfs")
	if _, err := Unpack(context.Background(), src, "", dst); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"d/new", "x/new"} {
		if got := readFile(t, filepath.Join(dst, p)); got != "new" {
			t.Errorf("%s = %q", p, got)
		}
	}
	if !lstat(t, filepath.Join(dst, "d/sub")).IsDir() {
		t.Error("d/sub is not a dir")
	}
	if got := readFile(t, filepath.Join(dst, "dotted")); got != "upper" {
		t.Errorf("dotted = %q", got)
	}
	for _, p := range []string{"d/old", "x/old", "no"} {
		assertMissing(t, filepath.Join(dst, p))
	}
}
