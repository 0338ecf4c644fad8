package layer

import (
	"bytes"
	"context"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

const (
	baseA = 200000
	baseB = 200000 + 7*idRange
)

// wantStats are the counts of buildTree.
var wantStats = Stats{Files: 15, Dirs: 19, Links: 2, Whiteouts: 3}

func sameCounts(t *testing.T, got Stats) {
	t.Helper()
	if got.Files != wantStats.Files || got.Dirs != wantStats.Dirs || got.Links != wantStats.Links || got.Whiteouts != wantStats.Whiteouts {
		t.Errorf("stats %+v, want counts %+v", got, wantStats)
	}
}

func TestRoundTrip(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	buildTree(t, src, baseA)
	want := snapshot(t, src, baseA)
	checkFixture(t, want)

	archive, pst := pack(t, src, baseA)
	sameCounts(t, pst)
	if pst.Compressed != int64(len(archive)) || pst.Bytes != int64(len(decompress(t, archive))) {
		t.Errorf("stats %+v, archive %d bytes", pst, len(archive))
	}
	if pst.Compressed > 200<<10 {
		t.Errorf("archive of a mostly sparse tree is %d bytes", pst.Compressed)
	}
	if again := snapshot(t, src, baseA); len(again) != len(want) {
		t.Fatal("Pack changed the tree")
	} else {
		sameTree(t, want, again)
	}

	dst := t.TempDir()
	ust, err := Unpack(context.Background(), bytes.NewReader(archive), dst, baseB, idRange, 1<<30)
	must(t, err)
	if ust != pst {
		t.Errorf("unpack stats %+v, pack stats %+v", ust, pst)
	}
	sameTree(t, want, snapshot(t, dst, baseB))

	// Zero blocks came back as holes.
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(dst, "big.bin"), &st))
	if st.Blocks*512 >= st.Size/2 {
		t.Errorf("big.bin uses %d bytes of disk for %d bytes: holes not kept", st.Blocks*512, st.Size)
	}
}

func TestCopyToBaseZero(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	buildTree(t, src, baseA)
	want := snapshot(t, src, baseA)
	dst := filepath.Join(t.TempDir(), "layer")
	st, err := Copy(context.Background(), src, dst, baseA, 0, idRange)
	must(t, err)
	sameCounts(t, st)
	if st.SHA256 != "" || st.Compressed != 0 {
		t.Errorf("copy stats %+v describe a compressed stream", st)
	}
	sameTree(t, want, snapshot(t, dst, 0))
	sameTree(t, want, snapshot(t, src, baseA)) // source untouched

	_, err = Copy(context.Background(), src, dst, baseA, 0, idRange)
	wantClass(t, err, errdefs.ErrAlreadyExists)
	_, err = Copy(context.Background(), src, filepath.Join(src, "sub"), baseA, 0, idRange)
	wantClass(t, err, errdefs.ErrInvalidArgument)
	// A failed copy (src owned outside the range) leaves no dst.
	bad := filepath.Join(t.TempDir(), "bad")
	_, err = Copy(context.Background(), src, bad, baseB, 0, idRange)
	wantClass(t, err, errdefs.ErrInvalidArgument)
	if _, err := os.Lstat(bad); !os.IsNotExist(err) {
		t.Errorf("failed copy left %s: %v", bad, err)
	}
}

// TestCycles suspends and resumes 20 times, each time onto another uid
// range: the tree and the archive must not drift.
func TestCycles(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	buildTree(t, dir, baseA)
	want := snapshot(t, dir, baseA)
	var firstTar []byte
	var firstSHA string
	base := baseA
	for i := range 20 {
		archive, st := pack(t, dir, base)
		tarStream := decompress(t, archive)
		if i == 0 {
			firstTar, firstSHA = tarStream, st.SHA256
		} else if !bytes.Equal(tarStream, firstTar) {
			t.Fatalf("cycle %d: tar stream differs from cycle 0 (%d vs %d bytes)", i, len(tarStream), len(firstTar))
		} else if st.SHA256 != firstSHA {
			t.Errorf("cycle %d: compressed sha %s, cycle 0 %s", i, st.SHA256, firstSHA)
		}
		base = baseA + (i%5+1)*idRange // a different range than the last
		next := t.TempDir()
		_, err := Unpack(context.Background(), bytes.NewReader(archive), next, uint32(base), idRange, 1<<30)
		must(t, err)
		dir = next
	}
	sameTree(t, want, snapshot(t, dir, base))
}

func TestPackRefuses(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name string
		make func(p string) error
	}{
		{"owner outside range", func(p string) error { return os.WriteFile(p, nil, 0o644) }}, // owned by host root
		{"block device", func(p string) error { return mknodOwned(p, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))) }},
		{"char device", func(p string) error { return mknodOwned(p, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			must(t, os.Chown(dir, baseA, baseA))
			must(t, tc.make(filepath.Join(dir, "culprit")))
			_, err := Pack(context.Background(), new(bytes.Buffer), dir, baseA, idRange)
			wantClass(t, err, errdefs.ErrInvalidArgument)
			if !strings.Contains(err.Error(), "culprit") {
				t.Errorf("error %q does not name the path", err)
			}
		})
	}
}

func mknodOwned(p string, mode uint32, dev int) error {
	if err := unix.Mknod(p, mode, dev); err != nil {
		return err
	}
	return os.Chown(p, baseA, baseA)
}

func TestPackSkipsSockets(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	must(t, os.Chown(dir, baseA, baseA))
	l, err := net.Listen("unix", filepath.Join(dir, "sock"))
	must(t, err)
	defer l.Close()
	must(t, os.Lchown(filepath.Join(dir, "sock"), baseA, baseA))
	archive, st := pack(t, dir, baseA)
	if st.Files != 0 || st.Dirs != 1 {
		t.Errorf("stats %+v", st)
	}
	out := t.TempDir()
	_, err = Unpack(context.Background(), bytes.NewReader(archive), out, baseB, idRange, 1<<20)
	must(t, err)
	emptyDirCheck(t, out)
}

func TestUnpackPreconditions(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	must(t, os.Chown(src, baseA, baseA))
	archive, _ := pack(t, src, baseA)
	ctx := context.Background()

	full := t.TempDir()
	must(t, os.WriteFile(filepath.Join(full, "x"), nil, 0o644))
	_, err := Unpack(ctx, bytes.NewReader(archive), full, baseB, idRange, 1<<20)
	wantClass(t, err, errdefs.ErrFailedPrecondition)
	_, err = Unpack(ctx, bytes.NewReader(archive), filepath.Join(full, "missing"), baseB, idRange, 1<<20)
	wantClass(t, err, errdefs.ErrNotFound)
	_, err = Unpack(ctx, bytes.NewReader(archive), t.TempDir(), baseB, idRange, 0)
	wantClass(t, err, errdefs.ErrInvalidArgument)
	_, err = Pack(ctx, new(bytes.Buffer), filepath.Join(full, "missing"), baseA, idRange)
	wantClass(t, err, errdefs.ErrNotFound)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	out := t.TempDir()
	_, err = Unpack(cancelled, bytes.NewReader(archive), out, baseB, idRange, 1<<20)
	if err == nil {
		t.Error("unpack with a cancelled context succeeded")
	}
	emptyDirCheck(t, out)
}

// checkFixture makes sure the reference tree has what the round trips are
// meant to preserve, so a builder mistake cannot make them vacuous.
func checkFixture(t *testing.T, tree map[string]node) {
	t.Helper()
	check := func(rel string, ok bool) {
		t.Helper()
		if !ok {
			t.Errorf("fixture %q: %+v", rel, tree[rel])
		}
	}
	check("bin/su", tree["bin/su"].Perm == 0o4755)
	check("bin/wall", tree["bin/wall"].Perm == 0o2755 && tree["bin/wall"].GID == 5)
	check("tmp", tree["tmp"].Perm == 0o1777)
	check("home/user/secret", tree["home/user/secret"].Perm == 0o600 && tree["home/user/secret"].UID == 1000)
	check("nobody", tree["nobody"].UID == 65534)
	check("gone", tree["gone"].Type == fs.ModeDevice|fs.ModeCharDevice && tree["gone"].Rdev == 0)
	check("fifo", tree["fifo"].Type == fs.ModeNamedPipe)
	check("opaque", tree["opaque"].Xattrs["user.overlay.opaque"] == "y")
	check("xgone", len(tree["xgone"].Xattrs) == 1)
	check("xattr.txt", tree["xattr.txt"].Xattrs["user.bin"] == "\x00\x01\xff=")
	check("hard1", tree["hard1"].LinkedTo == "a/hard2" && tree["hard1"].Nlink == 2)
	check("links/rel-hard", tree["links/rel-hard"].LinkedTo == "links/rel")
	check("links/abs", tree["links/abs"].Link == "/etc/passwd" && tree["links/abs"].UID == 1000)
	check("big.bin", tree["big.bin"].Size == 6<<20)
	check(".", tree["."].Mtime%1e9 != 0)
}
