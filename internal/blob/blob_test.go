package blob

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

func TestPutOpenRoundTrip(t *testing.T) {
	d, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	data := bytes.Repeat([]byte("hutch"), 100000)
	info, err := d.Put(ctx, "sbx-1.tar.zst", bytes.NewReader(data), 0)
	if err != nil || info.Size != int64(len(data)) || len(info.SHA256) != 64 {
		t.Fatalf("put: %+v %v", info, err)
	}
	rc, got, err := d.Open(ctx, "sbx-1.tar.zst")
	if err != nil || got != info {
		t.Fatalf("open: %+v %v", got, err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(b, data) {
		t.Fatalf("read back %d bytes, %v", len(b), err)
	}
}

func TestOverCapStoresNothingAndKeepsTheOld(t *testing.T) {
	dir := t.TempDir()
	d, _ := NewDir(dir)
	ctx := context.Background()
	if _, err := d.Put(ctx, "k", bytes.NewReader([]byte("old")), 10); err != nil {
		t.Fatal(err)
	}
	_, err := d.Put(ctx, "k", bytes.NewReader(make([]byte, 11)), 10)
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("over cap: %v", err)
	}
	rc, _, err := d.Open(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "old" {
		t.Fatalf("the old blob was replaced by a failed put: %q", b)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("leftovers in the store: %v", ents)
	}
}

func TestCorruptionIsDetectedOnRead(t *testing.T) {
	dir := t.TempDir()
	d, _ := NewDir(dir)
	ctx := context.Background()
	if _, err := d.Put(ctx, "k", bytes.NewReader([]byte("payload")), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "k"), []byte("paylaod"), 0o600); err != nil {
		t.Fatal(err)
	}
	rc, _, err := d.Open(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(rc)
	rc.Close()
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("corrupt blob read: %v", err)
	}
}

func TestMissingAndBadKeys(t *testing.T) {
	d, _ := NewDir(t.TempDir())
	ctx := context.Background()
	if _, _, err := d.Open(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	for _, k := range []string{"", "../x", "a/b", ".hidden"} {
		if _, err := d.Put(ctx, k, bytes.NewReader(nil), 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("key %q: %v", k, err)
		}
	}
	if err := d.Delete(ctx, "nope"); err != nil {
		t.Fatalf("delete missing: %v", err)
	}
}
