// Package blob keeps archives (suspended sandboxes' writable layers) behind
// a small interface, so a local directory today and an S3-compatible store
// later are interchangeable. A blob appears under its key only once it is
// complete and verified: it is written to a temporary name, hashed, read
// back, and renamed into place.
package blob

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Info describes a stored blob.
type Info struct {
	Key     string    `json:"key"`
	Size    int64     `json:"size"`
	SHA256  string    `json:"sha256"`
	Created time.Time `json:"created"`
}

// Store holds blobs by key.
type Store interface {
	// Put stores r under key. More than max bytes (when max > 0) fails with
	// ResourceExhausted and stores nothing. An existing key is replaced
	// only once the new blob is complete.
	Put(ctx context.Context, key string, r io.Reader, max int64) (Info, error)
	// Open reads a blob; a missing one is NotFound.
	Open(ctx context.Context, key string) (io.ReadCloser, Info, error)
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes a blob; a missing one is no error.
	Delete(ctx context.Context, key string) error
}

// Dir is a Store in a local directory.
type Dir struct{ root string }

var _ Store = (*Dir)(nil)

// NewDir opens (creating) a directory store. Temporary files a Put left
// when its process died (it removes them itself otherwise) are deleted:
// only one Dir may use a directory at a time, as one daemon does.
func NewDir(root string) (*Dir, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if name := e.Name(); e.Type().IsRegular() && isTemp(name) {
			if err := os.Remove(filepath.Join(root, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("blob: remove stale temporary file: %w", err)
			}
		}
	}
	return &Dir{root: root}, nil
}

// tempPrefix starts the name of every temporary file Put makes (data and
// metadata); no key can start with it.
const tempPrefix = ".put-"

func isTemp(name string) bool { return strings.HasPrefix(name, tempPrefix) }

var keyPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,200}$`)

func (d *Dir) paths(key string) (data, meta string, err error) {
	if !keyPattern.MatchString(key) {
		return "", "", fmt.Errorf("blob key %q: %w", key, errdefs.ErrInvalidArgument)
	}
	return filepath.Join(d.root, key), filepath.Join(d.root, key+".json"), nil
}

// Put implements Store.
func (d *Dir) Put(ctx context.Context, key string, r io.Reader, max int64) (Info, error) {
	data, meta, err := d.paths(key)
	if err != nil {
		return Info{}, err
	}
	tmp, err := os.CreateTemp(d.root, tempPrefix+"*")
	if err != nil {
		return Info{}, err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), limit(ctx, r, max))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Info{}, err
	}
	info := Info{Key: key, Size: n, SHA256: hex.EncodeToString(h.Sum(nil)), Created: time.Now().UTC()}
	if err := verify(tmp.Name(), info); err != nil {
		return Info{}, err
	}
	if err := writeMeta(meta, info); err != nil {
		return Info{}, err
	}
	if err := os.Rename(tmp.Name(), data); err != nil {
		return Info{}, err
	}
	return info, syncDir(d.root)
}

// limit reads r, failing once more than max bytes came or ctx ended.
func limit(ctx context.Context, r io.Reader, max int64) io.Reader {
	return &limitedReader{ctx: ctx, r: r, left: max, capped: max > 0, max: max}
}

type limitedReader struct {
	ctx    context.Context
	r      io.Reader
	left   int64
	max    int64
	capped bool
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if err := l.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := l.r.Read(p)
	if l.capped {
		l.left -= int64(n)
		if l.left < 0 {
			return 0, fmt.Errorf("blob is over its size cap of %d bytes: %w", l.max, errdefs.ErrResourceExhausted)
		}
	}
	return n, err
}

// verify reads a written file back and checks its hash and size.
func verify(path string, want Info) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	if n != want.Size || hex.EncodeToString(h.Sum(nil)) != want.SHA256 {
		return fmt.Errorf("blob %s read back differs from what was written: %w", want.Key, errdefs.ErrUnavailable)
	}
	return nil
}

func writeMeta(path string, info Info) error {
	raw, err := json.Marshal(info)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), tempPrefix+"*.json")
	if err != nil {
		return err
	}
	_, err = f.Write(raw)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Open implements Store. The blob's hash is checked as it is read: a reader
// that reaches the end of a changed blob gets an error, not bad data's EOF.
func (d *Dir) Open(ctx context.Context, key string) (io.ReadCloser, Info, error) {
	info, err := d.Stat(ctx, key)
	if err != nil {
		return nil, Info{}, err
	}
	data, _, _ := d.paths(key)
	f, err := os.Open(data)
	if err != nil {
		return nil, Info{}, notFound(key, err)
	}
	return &checked{f: f, h: sha256.New(), want: info}, info, nil
}

type checked struct {
	f *os.File
	h interface {
		Write([]byte) (int, error)
		Sum([]byte) []byte
	}
	want Info
	n    int64
}

func (c *checked) Read(p []byte) (int, error) {
	n, err := c.f.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	if err == io.EOF && (c.n != c.want.Size || hex.EncodeToString(c.h.Sum(nil)) != c.want.SHA256) {
		return n, fmt.Errorf("blob %s does not match its recorded sha256: %w", c.want.Key, errdefs.ErrFailedPrecondition)
	}
	return n, err
}

func (c *checked) Close() error { return c.f.Close() }

// Stat implements Store.
func (d *Dir) Stat(ctx context.Context, key string) (Info, error) {
	data, meta, err := d.paths(key)
	if err != nil {
		return Info{}, err
	}
	raw, err := os.ReadFile(meta)
	if err != nil {
		return Info{}, notFound(key, err)
	}
	if _, err := os.Stat(data); err != nil {
		return Info{}, notFound(key, err)
	}
	var info Info
	if err := json.Unmarshal(raw, &info); err != nil {
		return Info{}, fmt.Errorf("blob %s: metadata: %v: %w", key, err, errdefs.ErrFailedPrecondition)
	}
	return info, nil
}

// Delete implements Store.
func (d *Dir) Delete(ctx context.Context, key string) error {
	data, meta, err := d.paths(key)
	if err != nil {
		return err
	}
	for _, p := range []string{data, meta} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

func notFound(key string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob %s: %w", key, errdefs.ErrNotFound)
	}
	return err
}
