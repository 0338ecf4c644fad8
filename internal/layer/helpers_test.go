package layer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

const idRange = 65536

// needRoot skips tests that chown to arbitrary ids and make device nodes.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: chowns to other uid ranges and makes whiteout devices")
	}
}

// treeBuilder makes entries under root owned by base+N.
type treeBuilder struct {
	t    testing.TB
	root string
	base int
	n    int64 // mtime counter, so every entry gets its own ns mtime
}

func (b *treeBuilder) p(rel string) string { return filepath.Join(b.root, rel) }

func (b *treeBuilder) own(rel string, uid, gid int) {
	b.t.Helper()
	must(b.t, os.Lchown(b.p(rel), b.base+uid, b.base+gid))
}

// dir makes rel and its missing ancestors (left to fixOwners).
func (b *treeBuilder) dir(rel string, mode uint32, uid int) {
	b.t.Helper()
	must(b.t, os.MkdirAll(b.p(rel), 0o755))
	b.own(rel, uid, uid)
	must(b.t, unix.Chmod(b.p(rel), mode))
}

func (b *treeBuilder) file(rel string, data []byte, mode uint32, uid, gid int) {
	b.t.Helper()
	must(b.t, os.WriteFile(b.p(rel), data, 0o600))
	b.own(rel, uid, gid)
	must(b.t, unix.Chmod(b.p(rel), mode)) // after chown, which clears setuid
}

// fixOwners gives what MkdirAll made (owned by the host's root) to base+0.
func (b *treeBuilder) fixOwners() {
	b.t.Helper()
	must(b.t, filepath.WalkDir(b.root, func(p string, _ fs.DirEntry, err error) error {
		var st unix.Stat_t
		if err == nil {
			err = unix.Lstat(p, &st)
		}
		if err == nil && int(st.Uid) < b.base {
			err = os.Lchown(p, b.base, b.base)
		}
		return err
	}))
}

func (b *treeBuilder) symlink(rel, target string, uid int) {
	b.t.Helper()
	must(b.t, os.Symlink(target, b.p(rel)))
	b.own(rel, uid, uid)
}

func (b *treeBuilder) node(rel string, mode uint32, dev int, uid int) {
	b.t.Helper()
	must(b.t, unix.Mknod(b.p(rel), mode, dev))
	b.own(rel, uid, uid)
	must(b.t, unix.Chmod(b.p(rel), mode&0o7777))
}

func (b *treeBuilder) xattr(rel, name, value string) {
	b.t.Helper()
	must(b.t, unix.Lsetxattr(b.p(rel), name, []byte(value), 0))
}

// stamp gives every entry a distinct nanosecond mtime, deepest first so
// directories keep theirs.
func (b *treeBuilder) stamp() {
	b.t.Helper()
	var paths []string
	must(b.t, filepath.WalkDir(b.root, func(p string, _ fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	}))
	sort.Sort(sort.Reverse(sort.StringSlice(paths)))
	for _, p := range paths {
		b.n++
		ts := unix.Timespec{Sec: 1_600_000_000 + b.n, Nsec: 123_456_789 + b.n}
		must(b.t, unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
	}
}

// buildTree makes the reference tree: every kind of entry an upper holds.
func buildTree(t testing.TB, root string, base int) {
	t.Helper()
	b := &treeBuilder{t: t, root: root, base: base}
	b.dir(".", 0o755, 0)
	b.dir("bin", 0o755, 0)
	b.file("bin/su", []byte("setuid"), 0o4755, 0, 0)
	b.file("bin/wall", []byte("setgid"), 0o2755, 0, 5)
	b.dir("tmp", 0o1777, 0)
	b.dir("home/user", 0o700, 1000)
	b.file("home/user/secret", []byte("secret\n"), 0o600, 1000, 1000)
	b.file("nobody", []byte("nobody"), 0o644, 65534, 65534)
	b.dir("empty", 0o700, 0)
	b.dir("a/b/c", 0o750, 1000)
	b.file("a/b/c/d.txt", []byte("deep"), 0o640, 1000, 0)
	b.dir("links", 0o755, 0)
	b.symlink("links/rel", "../a/b/c/d.txt", 0)
	b.symlink("links/abs", "/etc/passwd", 1000)
	b.symlink("links/dangling", "nowhere/at/all", 0)
	must(t, os.Link(b.p("links/rel"), b.p("links/rel-hard"))) // a hard-linked symlink
	b.file("hard1", []byte("linked"), 0o644, 0, 0)
	must(t, os.Link(b.p("hard1"), b.p("a/hard2")))
	b.node("fifo", unix.S_IFIFO|0o640, 0, 0)
	b.node("gone", unix.S_IFCHR, 0, 0)          // a whiteout, as overlayfs makes it,
	must(t, os.Link(b.p("gone"), b.p("gone2"))) // linked to the others
	b.dir("opaque", 0o755, 0)
	b.xattr("opaque", "user.overlay.opaque", "y")
	b.file("opaque/new", []byte("new"), 0o644, 0, 0)
	b.file("xgone", nil, 0o644, 0, 0) // an xattr whiteout
	b.xattr("xgone", "user.overlay.whiteout", "")
	b.file("xattr.txt", []byte("x"), 0o644, 0, 0)
	b.xattr("xattr.txt", "user.foo", "bar")
	b.xattr("xattr.txt", "user.bin", "\x00\x01\xff=")
	b.file("weird \xff\n name", []byte("odd name"), 0o644, 0, 0)
	long := strings.Repeat("long-directory-name/", 8)
	b.dir(long, 0o755, 0)
	b.file(long+strings.Repeat("f", 200), []byte("long"), 0o644, 0, 0)
	sparse(t, b.p("big.bin"))
	b.own("big.bin", 0, 0)
	b.fixOwners()
	b.stamp()
}

// sparse writes a 6 MiB file that is mostly holes, with random data at
// three places.
func sparse(t testing.TB, p string) {
	f, err := os.Create(p)
	must(t, err)
	defer f.Close()
	must(t, f.Truncate(6<<20))
	rng := rand.New(rand.NewPCG(1, 2))
	for _, off := range []int64{0, 3 << 20, 6<<20 - 10000} {
		data := make([]byte, 10000)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		_, err := f.WriteAt(data, off)
		must(t, err)
	}
}

// node is everything compared between trees.
type node struct {
	Type     fs.FileMode
	Perm     uint32 // with setuid, setgid, sticky
	UID, GID int    // relative to the tree's base
	Size     int64
	SHA      string
	Mtime    int64
	Link     string
	Rdev     uint64
	Xattrs   map[string]string
	LinkedTo string // first path of a multiply linked inode
	Nlink    uint64
}

// snapshot describes the tree at root, ids relative to base.
func snapshot(t testing.TB, root string, base int) map[string]node {
	t.Helper()
	out := map[string]node{}
	inodes := map[uint64]string{}
	must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		must(t, unix.Lstat(p, &st))
		n := node{
			Type: d.Type(), Perm: st.Mode & 0o7777, UID: int(st.Uid) - base, GID: int(st.Gid) - base,
			Mtime: st.Mtim.Nano(), Rdev: st.Rdev, Xattrs: userXattrs(t, p),
		}
		switch d.Type() {
		case 0:
			n.Size, n.SHA = st.Size, fileSHA(t, p)
		case fs.ModeSymlink:
			n.Link, _ = os.Readlink(p)
		}
		// Whiteouts come back unlinked (see packer.child).
		if !d.IsDir() && st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFCHR {
			n.Nlink = st.Nlink
			if first, ok := inodes[st.Ino]; ok {
				n.LinkedTo = first
			} else {
				inodes[st.Ino] = rel
			}
		}
		out[rel] = n
		return nil
	}))
	return out
}

func userXattrs(t testing.TB, p string) map[string]string {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return nil
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	must(t, err)
	out := map[string]string{}
	for _, name := range strings.Split(string(buf[:sz]), "\x00") {
		if !strings.HasPrefix(name, "user.") {
			continue
		}
		v := make([]byte, 65536)
		n, err := unix.Lgetxattr(p, name, v)
		must(t, err)
		out[name] = string(v[:n])
	}
	return out
}

func fileSHA(t testing.TB, p string) string {
	f, err := os.Open(p)
	must(t, err)
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	must(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

// sameTree fails t with every difference between two snapshots.
func sameTree(t testing.TB, want, got map[string]node) {
	t.Helper()
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			t.Errorf("%q missing", k)
		case !equalNode(w, g):
			t.Errorf("%q differs:\n want %+v\n  got %+v", k, w, g)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%q unexpected", k)
		}
	}
}

func equalNode(a, b node) bool {
	return reflect.DeepEqual(a, b) || (len(a.Xattrs) == 0 && len(b.Xattrs) == 0 && equalNoXattrs(a, b))
}

func equalNoXattrs(a, b node) bool {
	a.Xattrs, b.Xattrs = nil, nil
	return reflect.DeepEqual(a, b)
}

// decompress returns the tar stream inside an archive.
func decompress(t testing.TB, archive []byte) []byte {
	t.Helper()
	dec, err := zstd.NewReader(bytes.NewReader(archive))
	must(t, err)
	defer dec.Close()
	out, err := io.ReadAll(dec)
	must(t, err)
	return out
}

func pack(t testing.TB, dir string, base int) ([]byte, Stats) {
	t.Helper()
	var buf bytes.Buffer
	st, err := Pack(context.Background(), &buf, dir, uint32(base), idRange)
	must(t, err)
	return buf.Bytes(), st
}

// emptyDirCheck fails t unless dir exists and is empty.
func emptyDirCheck(t testing.TB, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	for _, e := range ents {
		t.Errorf("left behind in %s: %q", dir, e.Name())
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantClass(t testing.TB, err, class error) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Fatalf("error %v, want class %v", err, class)
	}
}
