package imagefs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

func TestCacheSharesOneUnpack(t *testing.T) {
	requireRoot(t)
	a, _ := twoImages(t)
	src := writeTarball(t, map[string]v1.Image{"a:1": a})
	c, err := NewCache(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var unpacks atomic.Int32
	joined := make(chan struct{})
	c.onJoin = func(string) { close(joined) }
	c.onUnpack = func(string) {
		unpacks.Add(1)
		<-joined // hold the first unpack until the second Get waits on it
	}

	type result struct {
		rootfs string
		img    Image
		err    error
	}
	results := make([]result, 2)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			r, img, err := c.Get(context.Background(), src, "a:1")
			results[i] = result{r, img, err}
		})
	}
	wg.Wait()
	for _, r := range results {
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.rootfs != results[0].rootfs || r.img.Digest != configDigest(t, a) {
			t.Errorf("Get = %+v", r)
		}
	}
	if n := unpacks.Load(); n != 1 {
		t.Errorf("%d unpacks, want 1", n)
	}
	if got := readFile(t, filepath.Join(results[0].rootfs, "which")); got != "a" {
		t.Errorf("which = %q", got)
	}
	hex := strings.TrimPrefix(configDigest(t, a), "sha256:")
	if want := filepath.Join(c.dir, hex, "rootfs"); results[0].rootfs != want {
		t.Errorf("rootfs %s, want %s", results[0].rootfs, want)
	}

	// A later Get is a hit, also from a new Cache on the same dir.
	c.onUnpack = func(string) { unpacks.Add(1) }
	c2, err := NewCache(c.dir)
	if err != nil {
		t.Fatal(err)
	}
	c2.onUnpack = c.onUnpack
	for _, cc := range []*Cache{c, c2} {
		rootfs, img, err := cc.Get(context.Background(), src, "")
		if err != nil || rootfs != results[0].rootfs || img.Cmd[0] != "a" {
			t.Errorf("second Get = %s, %+v, %v", rootfs, img, err)
		}
	}
	if n := unpacks.Load(); n != 1 {
		t.Errorf("%d unpacks after hits, want 1", n)
	}
}

func TestCacheCrashLeftovers(t *testing.T) {
	requireRoot(t)
	a, _ := twoImages(t)
	src := writeTarball(t, map[string]v1.Image{"a:1": a})
	dir := t.TempDir()
	hex := strings.TrimPrefix(configDigest(t, a), "sha256:")

	// A crash mid-unpack leaves a temp dir with a partial tree.
	leftover := filepath.Join(dir, tmpPrefix+hex+"-12345")
	if err := os.MkdirAll(filepath.Join(leftover, "rootfs", "half"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Junk at the entry's own name without image.json is not complete either.
	if err := os.MkdirAll(filepath.Join(dir, hex, "rootfs", "junk"), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := NewCache(dir)
	if err != nil {
		t.Fatal(err)
	}
	assertMissing(t, leftover)
	var unpacks atomic.Int32
	c.onUnpack = func(string) { unpacks.Add(1) }
	rootfs, _, err := c.Get(context.Background(), src, "")
	if err != nil {
		t.Fatal(err)
	}
	if unpacks.Load() != 1 {
		t.Errorf("%d unpacks, want 1", unpacks.Load())
	}
	assertMissing(t, filepath.Join(rootfs, "junk"))
	if got := readFile(t, filepath.Join(rootfs, "which")); got != "a" {
		t.Errorf("which = %q", got)
	}
	if _, ok := readEntry(filepath.Join(dir, hex)); !ok {
		t.Error("entry not complete")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("cache dir holds %v, want only %s", ents, hex)
	}
}

func TestCacheFailedUnpackLeavesNothing(t *testing.T) {
	requireRoot(t)
	img := image(t, v1.Config{}, layer(t, file("../x", "x", 0o644, 0)))
	src := writeTarball(t, map[string]v1.Image{"evil:1": img})
	c, err := NewCache(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Get(context.Background(), src, ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("err = %v, want ErrInvalidArgument", err)
	}
	if ents, _ := os.ReadDir(c.dir); len(ents) != 0 {
		t.Errorf("cache dir holds %v after a failed unpack", ents)
	}
	if _, _, err := c.Get(context.Background(), filepath.Join(c.dir, "nope"), ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing src: %v, want ErrNotFound", err)
	}
}
