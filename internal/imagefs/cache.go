package imagefs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// Layout of a cache directory:
//
//	<dir>/<hex>/rootfs       the unpacked tree of the image whose config digest is sha256:<hex>
//	<dir>/<hex>/image.json   its Image, as JSON
//	<dir>/.tmp-<hex>-<rand>/ an entry being filled; renamed to <dir>/<hex> when complete
//
// An entry appears by one rename of a finished directory, so <dir>/<hex>
// never exists half-written, after a crash included: a crash leaves only a
// .tmp- directory, which NewCache removes.
const (
	tmpPrefix     = ".tmp-"
	rootfsName    = "rootfs"
	imageJSONName = "image.json"
)

// Cache keeps one unpacked copy of each image under a directory. Only one
// Cache (one process) may use a directory at a time: NewCache removes the
// temp dirs of earlier runs. Its methods are safe for concurrent use.
type Cache struct {
	dir string

	mu      sync.Mutex
	flights map[string]*flight // by digest hex

	// Test hooks: onUnpack runs before an unpack starts, onJoin when a Get
	// waits for another's unpack of the same image.
	onUnpack func(digest string)
	onJoin   func(digest string)
}

// flight is one unpack that concurrent Gets of the same image share.
type flight struct {
	done chan struct{}
	err  error
}

// NewCache opens (creating it if needed) the cache directory dir and
// removes leftovers of unpacks that never finished.
func NewCache(dir string) (*Cache, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("imagefs: cache dir: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("imagefs: cache dir: %w", err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return nil, fmt.Errorf("imagefs: clean cache: %w", err)
			}
		}
	}
	return &Cache{dir: dir, flights: map[string]*flight{}}, nil
}

// Get returns the unpacked root filesystem of the image ref names in src
// (see Unpack), unpacking it on first use. Concurrent Gets of one image
// share a single unpack. The returned tree must be treated as read-only.
func (c *Cache) Get(ctx context.Context, src, ref string) (rootfs string, img Image, err error) {
	im, meta, err := open(src, ref)
	if err != nil {
		return "", Image{}, err
	}
	h, err := v1.NewHash(meta.Digest)
	if err != nil {
		return "", Image{}, fmt.Errorf("imagefs: %w", malformed("config digest", err))
	}
	entry := filepath.Join(c.dir, h.Hex)
	for {
		if m, ok := readEntry(entry); ok {
			return filepath.Join(entry, rootfsName), m, nil
		}
		f, leader := c.join(h.Hex)
		if leader {
			// Re-check: a flight may have landed since the look above.
			m, ok := readEntry(entry)
			if !ok {
				f.err = c.fill(ctx, im, meta, entry)
				m = meta
			}
			c.land(h.Hex, f)
			if f.err != nil {
				return "", Image{}, f.err
			}
			return filepath.Join(entry, rootfsName), m, nil
		}
		if c.onJoin != nil {
			c.onJoin(meta.Digest)
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return "", Image{}, ctx.Err()
		}
		// A leader that was canceled failed only for itself: try again.
		if f.err != nil && !errors.Is(f.err, context.Canceled) && !errors.Is(f.err, context.DeadlineExceeded) {
			return "", Image{}, f.err
		}
	}
}

// join returns the flight for key, starting one (leader) if none is on.
func (c *Cache) join(key string) (f *flight, leader bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.flights[key]; ok {
		return f, false
	}
	f = &flight{done: make(chan struct{})}
	c.flights[key] = f
	return f, true
}

// land ends a flight started by join.
func (c *Cache) land(key string, f *flight) {
	c.mu.Lock()
	delete(c.flights, key)
	c.mu.Unlock()
	close(f.done)
}

// fill unpacks img into a temp dir and renames it to entry when complete.
func (c *Cache) fill(ctx context.Context, img v1.Image, meta Image, entry string) (err error) {
	tmp, err := os.MkdirTemp(c.dir, tmpPrefix+filepath.Base(entry)+"-")
	if err != nil {
		return fmt.Errorf("imagefs: cache: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("imagefs: cache: %w", err)
	}
	if c.onUnpack != nil {
		c.onUnpack(meta.Digest)
	}
	if err := unpackInto(ctx, img, filepath.Join(tmp, rootfsName)); err != nil {
		return err
	}
	if err := writeImageJSON(filepath.Join(tmp, imageJSONName), meta); err != nil {
		return err
	}
	return commit(tmp, entry)
}

// commit makes tmp durable and renames it to entry. A non-entry already at
// entry (no image.json) is replaced; a complete one wins over tmp.
func commit(tmp, entry string) error {
	if err := syncFS(tmp); err != nil {
		return err
	}
	err := os.Rename(tmp, entry)
	if err != nil {
		if _, ok := readEntry(entry); ok {
			return os.RemoveAll(tmp)
		}
		if rerr := os.RemoveAll(entry); rerr != nil {
			return fmt.Errorf("imagefs: cache: %w", rerr)
		}
		err = os.Rename(tmp, entry)
	}
	if err != nil {
		return fmt.Errorf("imagefs: cache: %w", err)
	}
	return syncDir(filepath.Dir(entry))
}

func writeImageJSON(p string, meta Image) error {
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return fmt.Errorf("imagefs: cache: %w", err)
	}
	if err := os.WriteFile(p, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("imagefs: cache: %w", err)
	}
	return nil
}

// readEntry reports whether entry is a complete cache entry and returns
// its Image.
func readEntry(entry string) (Image, bool) {
	b, err := os.ReadFile(filepath.Join(entry, imageJSONName))
	if err != nil {
		return Image{}, false
	}
	var m Image
	if json.Unmarshal(b, &m) != nil || m.Digest == "" {
		return Image{}, false
	}
	if fi, err := os.Lstat(filepath.Join(entry, rootfsName)); err != nil || !fi.IsDir() {
		return Image{}, false
	}
	return m, true
}

// syncFS flushes the filesystem holding p (the unpacked tree is many
// files; one syncfs beats an fsync each), so the rename that publishes it
// cannot reach the disk before its content.
func syncFS(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("imagefs: cache: %w", err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("imagefs: cache: %w", os.NewSyscallError("syncfs", err))
	}
	return nil
}

func syncDir(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("imagefs: cache: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil && !errors.Is(err, fs.ErrInvalid) {
		return fmt.Errorf("imagefs: cache: %w", err)
	}
	return nil
}
