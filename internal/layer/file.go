package layer

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// WriteFile packs dir into the file path atomically: the archive is written
// to a temporary file next to path, synced, read back and checked against
// its sha256, and only then renamed into place. maxCompressed > 0 caps the
// archive's size (errdefs.ErrResourceExhausted). On error nothing is left
// at path or beside it.
func WriteFile(ctx context.Context, path, dir string, uidBase, size uint32, maxCompressed int64) (st Stats, err error) {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return Stats{}, fmt.Errorf("layer: write %s: %w", path, classifyOpen(err))
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = fmt.Errorf("layer: write %s: %w", path, err)
		}
	}()
	lw := &limitWriter{w: f, max: maxCompressed}
	st, err = Pack(ctx, lw, dir, uidBase, size)
	if lw.over {
		return Stats{}, fmt.Errorf("archive exceeds %d bytes: %w", maxCompressed, errdefs.ErrResourceExhausted)
	}
	if err != nil {
		return Stats{}, err
	}
	if err := f.Sync(); err != nil {
		return Stats{}, err
	}
	if err := f.Close(); err != nil {
		return Stats{}, err
	}
	// Read the file back as the filesystem returns it (likely from the
	// page cache, so this checks the write path, not the medium): a short
	// or misplaced write shows here, not at resume time.
	n, err := verify(ctx, tmp, st.SHA256)
	if err != nil {
		return Stats{}, err
	}
	if n != st.Bytes {
		return Stats{}, fmt.Errorf("read back %d uncompressed bytes, wrote %d: %w", n, st.Bytes, errdefs.ErrFailedPrecondition)
	}
	if err := os.Rename(tmp, path); err != nil {
		return Stats{}, err
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		os.Remove(path) // the rename may not survive a crash: report none
		return Stats{}, err
	}
	return st, nil
}

// Verify checks that the archive at path has the sha256 (hex) sha256hex
// and decompresses to a readable tar stream; either failing is
// errdefs.ErrFailedPrecondition (the archive is corrupt).
func Verify(ctx context.Context, path, sha256hex string) error {
	_, err := verify(ctx, path, sha256hex)
	if err != nil {
		return fmt.Errorf("layer: verify %s: %w", path, err)
	}
	return nil
}

// verify reads path once: hashing it while decompressing and walking its
// tar headers. It returns the uncompressed size. Streaming keeps memory
// bounded even for a tampered file (the window is capped, as are PAX
// headers by archive/tar).
func verify(ctx context.Context, path, want string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, classifyOpen(err)
	}
	defer f.Close()
	src := &hashReader{r: &ctxReader{ctx: ctx, r: f}, sum: sha256.New()}
	n, derr := walkArchive(src)
	if src.err != nil {
		return 0, src.err // reading the file failed, or ctx ended
	}
	if _, err := io.Copy(io.Discard, src); err != nil {
		return 0, err
	}
	if got := hex.EncodeToString(src.sum.Sum(nil)); !strings.EqualFold(got, want) {
		return 0, fmt.Errorf("sha256 is %s, want %s: %w", got, want, errdefs.ErrFailedPrecondition)
	}
	if derr != nil {
		return 0, fmt.Errorf("archive unreadable: %w: %w", derr, errdefs.ErrFailedPrecondition)
	}
	return n, nil
}

// walkArchive decompresses r and reads every tar entry to the end,
// returning the uncompressed size.
func walkArchive(r io.Reader) (int64, error) {
	dec, err := zstd.NewReader(r, zstd.WithDecoderMaxWindow(maxWindow))
	if err != nil {
		return 0, err
	}
	defer dec.Close()
	cr := &countReader{r: dec}
	tr := tar.NewReader(cr)
	for {
		_, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	_, err = io.Copy(io.Discard, cr)
	return cr.n, err
}

// Copy copies the upper tree src into dst, which must not exist, as a
// lower layer: same content, xattrs, whiteouts and links, with owners
// shifted from [fromBase, fromBase+size) to [toBase, toBase+size). It runs
// Pack's walk into Unpack's writer through a pipe, so a copy is what a
// suspend and resume would make, except that the content of files of 1 MiB
// or more goes beside the stream: copied in the kernel (or shared, where
// the filesystem has reflinks), holes kept (see direct.go). On error dst
// is removed.
func Copy(ctx context.Context, src, dst string, fromBase, toBase, size uint32) (Stats, error) {
	if inside(src, dst) {
		return Stats{}, fmt.Errorf("layer: copy %s to %s: destination inside source: %w", src, dst, errdefs.ErrInvalidArgument)
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrAlreadyExists)
		}
		return Stats{}, fmt.Errorf("layer: copy: %w", classifyOpen(err))
	}
	pr, pw := io.Pipe()
	packed := make(chan error, 1)
	direct := &fdQueue{}
	defer direct.closeAll() // after <-packed: nothing pushes any more
	go func() {
		// Buffered: tar writes 512-byte headers one by one, and each write
		// to a pipe is a handoff between goroutines.
		bw := bufio.NewWriterSize(pw, 256<<10)
		_, err := packTar(ctx, bw, src, idMap{base: fromBase, size: size}, direct)
		if err == nil {
			err = bw.Flush()
		}
		pw.CloseWithError(err)
		packed <- err
	}()
	st, err := unpackTar(ctx, bufio.NewReaderSize(pr, 256<<10), dst, idMap{base: toBase, size: size}, math.MaxInt64, direct)
	pr.CloseWithError(errors.New("unpack ended")) // unblocks a packer still writing
	if perr := <-packed; perr != nil {
		err = perr // the cause; the unpacker only saw the pipe fail
	}
	if err != nil {
		os.RemoveAll(dst)
		return Stats{}, fmt.Errorf("layer: copy %s to %s: %w", src, dst, err)
	}
	return st, nil
}

// inside reports whether dst is src or below it.
func inside(src, dst string) bool {
	s, err1 := filepath.Abs(src)
	d, err2 := filepath.Abs(dst)
	if err1 != nil || err2 != nil {
		return false
	}
	return d == s || strings.HasPrefix(d, s+string(filepath.Separator))
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// limitWriter fails once more than max bytes (when max > 0) are written.
type limitWriter struct {
	w    io.Writer
	max  int64
	n    int64
	over bool
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.max > 0 && l.n+int64(len(p)) > l.max {
		l.over = true
		return 0, fmt.Errorf("more than %d bytes: %w", l.max, errdefs.ErrResourceExhausted)
	}
	n, err := l.w.Write(p)
	l.n += int64(n)
	return n, err
}

// countReader counts what is read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// ctxReader stops reading once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
