package layer

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

func TestWriteFile(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	src := t.TempDir()
	buildTree(t, src, baseA)
	want := snapshot(t, src, baseA)
	out := t.TempDir()
	path := filepath.Join(out, "upper.tar.zst")

	st, err := WriteFile(ctx, path, src, baseA, idRange, 0)
	must(t, err)
	sameCounts(t, st)
	fi, err := os.Stat(path)
	must(t, err)
	if fi.Size() != st.Compressed {
		t.Errorf("file is %d bytes, stats say %d", fi.Size(), st.Compressed)
	}
	only(t, out, "upper.tar.zst")
	must(t, Verify(ctx, path, st.SHA256))

	f, err := os.Open(path)
	must(t, err)
	dst := t.TempDir()
	ust, err := Unpack(ctx, f, dst, baseB, idRange, 1<<30)
	f.Close()
	must(t, err)
	if ust != st {
		t.Errorf("unpack stats %+v, write stats %+v", ust, st)
	}
	sameTree(t, want, snapshot(t, dst, baseB))

	// Rewriting an existing archive replaces it whole.
	st2, err := WriteFile(ctx, path, src, baseA, idRange, st.Compressed)
	must(t, err)
	if st2.SHA256 != st.SHA256 {
		t.Errorf("same tree, different archive: %s vs %s", st2.SHA256, st.SHA256)
	}
	only(t, out, "upper.tar.zst")
}

func TestWriteFileCap(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	buildTree(t, src, baseA)
	out := t.TempDir()
	path := filepath.Join(out, "upper.tar.zst")
	_, err := WriteFile(context.Background(), path, src, baseA, idRange, 4096)
	wantClass(t, err, errdefs.ErrResourceExhausted)
	only(t, out)

	_, err = WriteFile(context.Background(), path, src, baseB, idRange, 0) // owners outside the range
	wantClass(t, err, errdefs.ErrInvalidArgument)
	only(t, out)
	_, err = WriteFile(context.Background(), filepath.Join(out, "no", "such", "dir"), src, baseA, idRange, 0)
	wantClass(t, err, errdefs.ErrNotFound)
}

func TestVerifyDetectsCorruption(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	src := t.TempDir()
	buildTree(t, src, baseA)
	path := filepath.Join(t.TempDir(), "upper.tar.zst")
	st, err := WriteFile(ctx, path, src, baseA, idRange, 0)
	must(t, err)

	data, err := os.ReadFile(path)
	must(t, err)
	for _, at := range []int{0, len(data) / 2, len(data) - 1} {
		bad := append([]byte(nil), data...)
		bad[at] ^= 0x40
		must(t, os.WriteFile(path, bad, 0o600))
		wantClass(t, Verify(ctx, path, st.SHA256), errdefs.ErrFailedPrecondition)
	}
	must(t, os.WriteFile(path, data[:len(data)-10], 0o600))
	wantClass(t, Verify(ctx, path, st.SHA256), errdefs.ErrFailedPrecondition)
	must(t, os.WriteFile(path, data, 0o600))
	must(t, Verify(ctx, path, st.SHA256))
	wantClass(t, Verify(ctx, path, "00"+st.SHA256[2:]), errdefs.ErrFailedPrecondition)
	wantClass(t, Verify(ctx, path+".missing", st.SHA256), errdefs.ErrNotFound)
}

// only fails t unless dir holds exactly names (no temporary files).
func only(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if len(got) != len(names) {
		t.Fatalf("%s holds %q, want %q", dir, got, names)
	}
	for i := range got {
		if got[i] != names[i] {
			t.Fatalf("%s holds %q, want %q", dir, got, names)
		}
	}
}

func TestCancelled(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	buildTree(t, src, baseA)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Pack(ctx, io.Discard, src, baseA, idRange)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("pack: %v", err)
	}
	out := t.TempDir()
	_, err = WriteFile(ctx, filepath.Join(out, "a.tar.zst"), src, baseA, idRange, 0)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("write file: %v", err)
	}
	only(t, out)
	_, err = Copy(ctx, src, filepath.Join(out, "copy"), baseA, 0, idRange)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("copy: %v", err)
	}
	only(t, out)
}
