package hutch_test

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"io"
	"io/fs"
	"slices"
	"testing"

	hutch "github.com/hutch-dev/hutch/sdk"
)

func testFiles(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	if err := sb.WriteFile(ctx, "dir/bin.dat", allBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := sb.ReadFile(ctx, "/workspace/dir/bin.dat"); err != nil || !bytes.Equal(got, allBytes) {
		t.Fatalf("read back %q, %v", got, err)
	}
	fi, err := sb.Stat(ctx, "dir/bin.dat")
	if err != nil || fi.Size != int64(len(allBytes)) || fi.Mode != 0o600 || fi.IsDir() || fi.Name != "bin.dat" || fi.Type != "file" {
		t.Fatalf("stat %+v, %v", fi, err)
	}
	if fi, err := sb.Stat(ctx, "dir"); err != nil || !fi.IsDir() || fi.Mode.Perm() != 0o755 {
		t.Fatalf("stat dir %+v, %v", fi, err)
	}
	data, err := sb.ReadFile(ctx, "missing.txt")
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	if data != nil {
		t.Fatalf("missing file data %q", data)
	}
	data, ok, err := sb.ReadFileIfExists(ctx, "missing.txt")
	if data != nil || ok || err != nil {
		t.Fatalf("ReadFileIfExists(missing) = %q, %v, %v", data, ok, err)
	}
	data, ok, err = sb.ReadFileIfExists(ctx, "dir/bin.dat")
	if !bytes.Equal(data, allBytes) || !ok || err != nil {
		t.Fatalf("ReadFileIfExists = %q, %v, %v", data, ok, err)
	}
	_, err = sb.Stat(ctx, "missing.txt")
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	for path, want := range map[string]bool{"dir/bin.dat": true, "dir": true, "missing.txt": false} {
		if got, err := sb.Exists(ctx, path); err != nil || got != want {
			t.Fatalf("exists(%s) = %v, %v", path, got, err)
		}
	}
	if err := sb.WriteFile(ctx, "run.sh", []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Exec(ctx, "./run.sh"); err != nil || string(res.Stdout) != "ran\n" {
		t.Fatalf("written script: %+v, %v", res, err)
	}
	if fi, err := sb.Stat(ctx, "run.sh"); err != nil || fi.Mode != 0o755 {
		t.Fatalf("stat script %+v, %v", fi, err)
	}
}

func testFileTree(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	if err := sb.Mkdir(ctx, "a/b/c", 0o700); err != nil {
		t.Fatal(err)
	}
	if fi, err := sb.Stat(ctx, "a/b/c"); err != nil || !fi.IsDir() || fi.Mode.Perm() != 0o700 {
		t.Fatalf("mkdir: %+v, %v", fi, err)
	}
	for _, f := range []string{"a/x.go", "a/b/y.go", "a/b/z.txt"} {
		if err := sb.WriteFile(ctx, f, []byte(f), 0); err != nil {
			t.Fatal(err)
		}
	}
	names := func(depth int, glob string) []string {
		fis, err := sb.ListFiles(ctx, "a", depth, glob)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, fi := range fis {
			out = append(out, fi.Name)
		}
		slices.Sort(out)
		return out
	}
	if got := names(0, ""); !slices.Equal(got, []string{"b", "x.go"}) {
		t.Fatalf("depth 1: %v", got)
	}
	if got := names(3, "*.go"); !slices.Equal(got, []string{"x.go", "y.go"}) {
		t.Fatalf("depth 3, *.go: %v", got)
	}
	if err := sb.Rename(ctx, "a/x.go", "a/b/c/x2.go"); err != nil {
		t.Fatal(err)
	}
	if got, err := sb.ReadFile(ctx, "a/b/c/x2.go"); err != nil || string(got) != "a/x.go" {
		t.Fatalf("renamed: %q, %v", got, err)
	}
	if err := sb.Rename(ctx, "nope", "nope2"); err == nil {
		t.Fatal("renaming a missing file succeeded")
	}
	if err := sb.Remove(ctx, "a", hutch.RemoveOptions{}); err == nil {
		t.Fatal("removing a directory without Recursive succeeded")
	}
	if err := sb.Remove(ctx, "a", hutch.RemoveOptions{Recursive: true}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := sb.Exists(ctx, "a"); ok {
		t.Fatal("a survived its removal")
	}
	wantErr(t, sb.Remove(ctx, "a", hutch.RemoveOptions{}), hutch.ErrNotFound, "not_found")
	if err := sb.Remove(ctx, "a", hutch.RemoveOptions{Force: true}); err != nil {
		t.Fatalf("forced removal of a missing path: %v", err)
	}
}

func testBigFile(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	big := make([]byte, 5<<20+7)
	_, _ = rand.Read(big)
	if err := sb.WriteFileFrom(ctx, "/tmp/big", bytes.NewReader(big), 0o644); err != nil {
		t.Fatal(err)
	}
	rc, err := sb.ReadFileStream(ctx, "/tmp/big")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("big file: %d bytes back, %v", len(got), err)
	}
	_, err = sb.ReadFileStream(ctx, "/tmp/none")
	wantErr(t, err, hutch.ErrNotFound, "not_found")
}

type entry struct {
	name, body, link string
	mode             int64
	typ              byte
}

func makeTar(t *testing.T, entries []entry) *bytes.Buffer {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, en := range entries {
		hdr := &tar.Header{Name: en.name, Mode: en.mode, Typeflag: en.typ, Linkname: en.link, Size: int64(len(en.body))}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(tw, en.body)
	}
	_ = tw.Close()
	return &buf
}

func testArchive(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	in := makeTar(t, []entry{
		{name: "src/", mode: 0o755, typ: tar.TypeDir},
		{name: "src/main.go", body: "package main\n", mode: 0o644, typ: tar.TypeReg},
		{name: "src/run", body: "#!/bin/sh\n", mode: 0o755, typ: tar.TypeReg},
		{name: "link", link: "src/main.go", typ: tar.TypeSymlink},
	})
	if err := sb.UploadArchive(ctx, "proj", in); err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Exec(ctx, "cat proj/link; test -x proj/src/run && echo exec"); err != nil || string(res.Stdout) != "package main\nexec\n" {
		t.Fatalf("extracted: %+v, %v", res, err)
	}
	rc, err := sb.DownloadArchive(ctx, "proj")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[hdr.Name] = hdr
	}
	if len(got) != 4 || got["link"].Linkname != "src/main.go" || fs.FileMode(got["src/run"].Mode).Perm() != 0o755 || got["src/main.go"].Size != 13 {
		t.Fatalf("downloaded %v", got)
	}
	evil := makeTar(t, []entry{{name: "../evil", body: "x", mode: 0o644, typ: tar.TypeReg}})
	wantErr(t, sb.UploadArchive(ctx, "proj", evil), hutch.ErrInvalidArgument, "invalid_argument")
	_, err = sb.DownloadArchive(ctx, "proj/src/main.go")
	wantErr(t, err, hutch.ErrFailedPrecondition, "failed_precondition")
	_, err = sb.DownloadArchive(ctx, "nope")
	wantErr(t, err, hutch.ErrNotFound, "not_found")
}
