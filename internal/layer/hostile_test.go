package layer

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// ent is one entry of a hand-made archive.
type ent struct {
	hdr  tar.Header
	body string
}

func dirE(name string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}}
}
func fileEnt(name, body string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))}, body: body}
}
func linkEnt(flag byte, name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: flag, Name: name, Linkname: target, Mode: 0o777}}
}

// archiveOf compresses entries after a valid prefix ("./", "ok/",
// "ok/file"), so every hostile archive has something to clean up.
func archiveOf(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	prefix := []ent{dirE("./"), dirE("ok/"), fileEnt("ok/file", "fine")}
	for _, e := range append(prefix, ents...) {
		h := e.hdr
		if h.Typeflag != tar.TypeXGlobalHeader {
			h.ModTime = time.Unix(1_700_000_000, 0)
			h.Format = tar.FormatPAX
		}
		must(t, tw.WriteHeader(&h))
		_, err := tw.Write([]byte(e.body))
		must(t, err)
	}
	must(t, tw.Close())
	return compress(t, tarBuf.Bytes())
}

func compress(t testing.TB, data []byte) []byte {
	var out bytes.Buffer
	enc, err := zstd.NewWriter(&out)
	must(t, err)
	_, err = enc.Write(data)
	must(t, err)
	must(t, enc.Close())
	return out.Bytes()
}

func TestUnpackHostile(t *testing.T) {
	needRoot(t)
	pwned := fmt.Sprintf("/tmp/pwned-%d", os.Getpid())
	os.Remove(pwned)
	big := strings.Repeat("A", 64<<10)
	inval, exhausted := errdefs.ErrInvalidArgument, errdefs.ErrResourceExhausted
	withUID := func(e ent, uid, gid int) ent { e.hdr.Uid, e.hdr.Gid = uid, gid; return e }
	withXattr := func(e ent, k, v string) ent { e.hdr.PAXRecords = map[string]string{paxXattr + k: v}; return e }
	truncated := archiveOf(t, fileEnt("big", big))
	cases := []struct {
		name    string
		archive []byte
		class   error
	}{
		{"dotdot", archiveOf(t, fileEnt("../x", "x")), inval},
		{"dotdot inside", archiveOf(t, fileEnt("ok/../../x", "x")), inval},
		{"absolute", archiveOf(t, fileEnt("/abs", "x")), inval},
		{"symlink escape", archiveOf(t, linkEnt(tar.TypeSymlink, "evil", "/"),
			fileEnt("evil/tmp/"+filepath.Base(pwned), "pwned")), inval},
		{"symlink escape dir", archiveOf(t, linkEnt(tar.TypeSymlink, "evil", "/tmp"),
			dirE("evil/"), fileEnt("evil/"+filepath.Base(pwned), "pwned")), inval},
		{"hard link absolute", archiveOf(t, linkEnt(tar.TypeLink, "passwd", "/etc/passwd")), inval},
		{"hard link dotdot", archiveOf(t, linkEnt(tar.TypeLink, "passwd", "../../../../../etc/passwd")), inval},
		{"hard link through symlink", archiveOf(t, linkEnt(tar.TypeSymlink, "etc", "/etc"),
			linkEnt(tar.TypeLink, "passwd", "etc/passwd")), inval},
		{"hard link missing", archiveOf(t, linkEnt(tar.TypeLink, "x", "nope")), inval},
		{"hard link to dir", archiveOf(t, linkEnt(tar.TypeLink, "x", "ok")), inval},
		{"uid too big", archiveOf(t, withUID(fileEnt("u", "x"), 70000, 0)), inval},
		{"gid too big", archiveOf(t, withUID(fileEnt("g", "x"), 0, 65536)), inval},
		{"negative uid", archiveOf(t, withUID(fileEnt("n", "x"), -1, 0)), inval},
		{"block device", archiveOf(t, dev(tar.TypeBlock, 8, 0)), inval},
		{"char device", archiveOf(t, dev(tar.TypeChar, 1, 3)), inval},
		{"security xattr", archiveOf(t, withXattr(fileEnt("cap", "x"), "security.capability", "\x01")), inval},
		{"trusted xattr", archiveOf(t, withXattr(dirE("d/"), "trusted.overlay.opaque", "y")), inval},
		{"xattr on symlink", archiveOf(t, withXattr(linkEnt(tar.TypeSymlink, "s", "x"), "user.a", "b")), inval},
		{"duplicate", archiveOf(t, fileEnt("ok/file", "again")), inval},
		{"no parent", archiveOf(t, fileEnt("a/b", "x")), inval},
		{"parent closed", archiveOf(t, dirE("z/"), fileEnt("ok/late", "x")), inval},
		{"root late", archiveOf(t, dirE("./")), inval},
		{"unclean name", archiveOf(t, fileEnt("ok//x", "x")), inval},
		{"dot name", archiveOf(t, fileEnt("./x", "x")), inval},
		{"global header", archiveOf(t, ent{hdr: tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "g",
			PAXRecords: map[string]string{"comment": "x"}}}), inval},
		{"over max bytes", archiveOf(t, fileEnt("big", big)), exhausted},
		{"garbage", []byte("this is not zstd at all, not even close"), inval},
		{"truncated zstd", truncated[:len(truncated)/2], inval},
		{"truncated tar", compress(t, decompress(t, truncated)[:3000]), inval},
		{"trailing garbage", append(archiveOf(t), "garbage after the frame"...), inval},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var before unix.Stat_t
			must(t, unix.Stat(dir, &before))
			_, err := Unpack(context.Background(), bytes.NewReader(tc.archive), dir, baseA, idRange, 32<<10)
			wantClass(t, err, tc.class)
			t.Log(err)
			emptyDirCheck(t, dir)
			var after unix.Stat_t
			must(t, unix.Stat(dir, &after))
			if after.Uid != before.Uid || after.Mode != before.Mode {
				t.Errorf("root changed to %d %o", after.Uid, after.Mode)
			}
			if _, err := os.Lstat(pwned); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s exists: %v", pwned, err)
			}
		})
	}
}

// TestUnpackAcceptsLimits checks the edges the hostile cases sit just past.
func TestUnpackAcceptsLimits(t *testing.T) {
	needRoot(t)
	archive := archiveOf(t, linkEnt(tar.TypeLink, "ok/again", "ok/file"),
		ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "top", Uid: 65535, Gid: 65535, Mode: 0o4755}},
		dev(tar.TypeChar, 0, 0))
	size := int64(len(decompress(t, archive)))
	dir := t.TempDir()
	st, err := Unpack(context.Background(), bytes.NewReader(archive), dir, baseA, idRange, size) // exactly the cap
	must(t, err)
	if st.Bytes != size || st.Whiteouts != 1 || st.Links != 1 || st.Files != 2 || st.Dirs != 2 {
		t.Errorf("stats %+v", st)
	}
	var fst unix.Stat_t
	must(t, unix.Stat(filepath.Join(dir, "top"), &fst))
	if fst.Uid != baseA+65535 || fst.Mode&0o7777 != 0o4755 {
		t.Errorf("top: uid %d mode %o", fst.Uid, fst.Mode)
	}
	dir2 := t.TempDir()
	_, err = Unpack(context.Background(), bytes.NewReader(archive), dir2, baseA, idRange, size-1)
	wantClass(t, err, errdefs.ErrResourceExhausted)
	emptyDirCheck(t, dir2)
}

func dev(flag byte, major, minor int64) ent {
	return ent{hdr: tar.Header{Typeflag: flag, Name: "dev", Mode: 0o600, Devmajor: major, Devminor: minor}}
}

// TestDepthLimit checks that Pack and Unpack agree on the nesting limit, so
// a tree too deep to restore is refused when suspending, not resuming.
func TestDepthLimit(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	for _, depth := range []int{maxDepth, maxDepth + 1} {
		dir := t.TempDir()
		must(t, os.Chown(dir, baseA, baseA))
		deep := filepath.Join(dir, strings.Repeat("d/", depth))
		must(t, os.MkdirAll(deep, 0o755))
		(&treeBuilder{t: t, root: dir, base: baseA}).fixOwners()
		var buf bytes.Buffer
		_, err := Pack(ctx, &buf, dir, baseA, idRange)
		if depth > maxDepth {
			wantClass(t, err, errdefs.ErrInvalidArgument)
			continue
		}
		must(t, err)
		_, err = Unpack(ctx, bytes.NewReader(buf.Bytes()), t.TempDir(), baseB, idRange, 1<<30)
		must(t, err)
	}
	var ents []ent
	for i := 1; i <= maxDepth+1; i++ {
		ents = append(ents, dirE(strings.Repeat("d/", i)))
	}
	dir := t.TempDir()
	_, err := Unpack(ctx, bytes.NewReader(archiveOf(t, ents...)), dir, baseA, idRange, 1<<30)
	wantClass(t, err, errdefs.ErrInvalidArgument)
	emptyDirCheck(t, dir)
}
