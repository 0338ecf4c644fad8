package layer

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// TestCopyLargeFiles: files of directMin bytes or more, whose content Copy
// sends beside the stream, come out the same as the rest: content, holes,
// owners, setuid, xattrs, mtimes and hard links; files just under the
// threshold go through the stream. No descriptor is left open.
func TestCopyLargeFiles(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	b := &treeBuilder{t: t, root: src, base: baseA}
	b.dir(".", 0o755, 0)
	rng := rand.New(rand.NewPCG(7, 8))
	random := func(n int) []byte {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		return p
	}
	b.dir("big", 0o755, 1000)
	b.file("big/exact", random(directMin), 0o644, 1000, 1000)
	b.file("big/under", random(directMin-1), 0o600, 0, 0)
	b.file("big/setuid", random(3<<20+17), 0o4755, 0, 0)
	b.xattr("big/setuid", "user.note", "kept")
	b.file("big/zeros", make([]byte, 2<<20), 0o644, 0, 0) // allocated zeros stay data
	sparse(t, b.p("big/sparse"))
	b.own("big/sparse", 0, 0)
	must(t, os.Link(b.p("big/setuid"), b.p("big/setuid-link")))
	b.fixOwners()
	b.stamp()
	want := snapshot(t, src, baseA)
	before := openFds(t)
	// These four go beside the stream (the link is a link entry).
	q := &fdQueue{}
	_, err := packTar(context.Background(), io.Discard, src, idMap{base: baseA, size: idRange}, q)
	must(t, err)
	if len(q.fds) != 4 {
		t.Errorf("%d files went beside the stream, want 4 (exact, setuid, zeros, sparse)", len(q.fds))
	}
	q.closeAll()

	dst := filepath.Join(t.TempDir(), "layer")
	st, err := Copy(context.Background(), src, dst, baseA, 0, idRange)
	must(t, err)
	sameTree(t, want, snapshot(t, dst, 0))
	if st.Files != 5 || st.Links != 1 {
		t.Errorf("stats %+v: want 5 files and 1 link", st)
	}
	var total int64
	for _, n := range want {
		if n.Type.IsRegular() && n.LinkedTo == "" {
			total += n.Size
		}
	}
	if st.Bytes < total {
		t.Errorf("stats say %d bytes for %d bytes of content", st.Bytes, total)
	}
	var sst unix.Stat_t
	must(t, unix.Stat(filepath.Join(dst, "big/sparse"), &sst))
	if sst.Blocks*512 >= sst.Size/2 {
		t.Errorf("big/sparse uses %d bytes of disk for %d bytes: holes not kept", sst.Blocks*512, sst.Size)
	}
	if after := openFds(t); after != before {
		t.Errorf("%d descriptors open after the copy, %d before", after, before)
	}

	// A copy that fails half way (an owner outside the range, met after
	// the large files) leaves nothing and no descriptor either.
	b.file("zz-outsider", []byte("x"), 0o644, 0, 0)
	must(t, os.Lchown(b.p("zz-outsider"), baseB, baseB))
	bad := filepath.Join(t.TempDir(), "bad")
	_, err = Copy(context.Background(), src, bad, baseA, 0, idRange)
	wantClass(t, err, errdefs.ErrInvalidArgument)
	if _, err := os.Lstat(bad); !os.IsNotExist(err) {
		t.Errorf("failed copy left %s: %v", bad, err)
	}
	if after := openFds(t); after != before {
		t.Errorf("%d descriptors open after a failed copy, %d before", after, before)
	}
}

// TestUnpackRefusesDirectRecords: the record that makes Copy take a file's
// content from beside the stream means nothing in an archive: Unpack
// refuses it and leaves the directory empty.
func TestUnpackRefusesDirectRecords(t *testing.T) {
	needRoot(t)
	e := fileEnt("x", "")
	e.hdr.PAXRecords = map[string]string{directKey: "4096"}
	dir := t.TempDir()
	_, err := Unpack(context.Background(), bytes.NewReader(archiveOf(t, e)), dir, baseB, idRange, 1<<30)
	wantClass(t, err, errdefs.ErrInvalidArgument)
	emptyDirCheck(t, dir)
}

func openFds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	must(t, err)
	return len(ents)
}
