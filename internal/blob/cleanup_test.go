package blob

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestNewDirRemovesStaleTemporaries: a Put whose process was killed leaves
// its temporary data (and perhaps metadata) file; the next NewDir on the
// directory deletes them and keeps every blob.
func TestNewDirRemovesStaleTemporaries(t *testing.T) {
	dir := t.TempDir()
	d, err := NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	data := bytes.Repeat([]byte("kept"), 1000)
	if _, err := d.Put(ctx, "kept.tar.zst", bytes.NewReader(data), 0); err != nil {
		t.Fatal(err)
	}
	if tmp := temporaries(t, dir); len(tmp) > 0 {
		t.Fatalf("Put left %v", tmp)
	}
	// What a kill -9 in the middle of Put leaves.
	for _, name := range []string{".put-123456", ".put-987654.json"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d, err = NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tmp := temporaries(t, dir); len(tmp) > 0 {
		t.Fatalf("NewDir left %v", tmp)
	}
	rc, _, err := d.Open(ctx, "kept.tar.zst")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the kept blob after NewDir: %d bytes, %v", len(got), err)
	}
}

// TestFailedPutLeavesNoTemporary: a Put over its cap or whose reader fails
// removes what it wrote.
func TestFailedPutLeavesNoTemporary(t *testing.T) {
	dir := t.TempDir()
	d, err := NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := d.Put(ctx, "big", bytes.NewReader(make([]byte, 4096)), 100); err == nil {
		t.Fatal("a Put over its cap succeeded")
	}
	if _, err := d.Put(ctx, "broken", io.MultiReader(bytes.NewReader(make([]byte, 100)), errReader{}), 0); err == nil {
		t.Fatal("a Put whose reader failed succeeded")
	}
	if tmp := temporaries(t, dir); len(tmp) > 0 {
		t.Fatalf("failed Puts left %v", tmp)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrClosedPipe }

func temporaries(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, tempPrefix+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}
