// Package layer copies overlayfs upper directories faithfully, shifting
// their ownership from one host uid range to another.
//
// Suspending a sandbox archives its whole overlay upper (so packages it
// installed survive, not only /workspace) and resuming restores it into a
// fresh upper, possibly on another host uid range; templates freeze an upper
// into an immutable lower layer. Both need every file kind overlayfs puts in
// an upper, including its own metadata: whiteouts (character devices 0:0, or
// files carrying user.overlay.whiteout), opaque directories
// (user.overlay.opaque=y) and the other user.overlay.* xattrs. hutch mounts
// its overlays with userxattr, so these live in the user.* namespace, which
// is the namespace this package preserves.
//
// The archive is a PAX tar compressed with zstd. Owners are stored relative
// to the sandbox's uid base (in-sandbox ids), so an archive does not depend
// on the host slot it came from. The tree is walked in sorted order, so equal
// trees give byte-identical archives. An archive is untrusted input when it
// is read back: nothing it says can write outside the destination.
package layer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/klauspost/compress/zstd"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Stats describes one archive or copy.
type Stats struct {
	// Files counts regular files, symlinks and fifos; Dirs counts
	// directories including the root; Links counts hard links (entries
	// after the first name of an inode); Whiteouts counts overlay whiteouts
	// (character devices 0:0 and files carrying user.overlay.whiteout).
	Files, Dirs, Links, Whiteouts int
	// Bytes is the size of the uncompressed tar stream.
	Bytes int64
	// SHA256 (hex) and Compressed describe the compressed stream; they are
	// empty for Copy, which compresses nothing.
	SHA256     string
	Compressed int64
}

// Overlay metadata names (userxattr mode).
const (
	xattrPrefix   = "user."
	whiteoutXattr = "user.overlay.whiteout"
	paxXattr      = "SCHILY.xattr."
)

// maxWindow bounds the zstd window a stream may ask for when decoding: the
// encoder here never uses more than 8 MiB, and a hostile header must not
// make the decoder allocate gigabytes.
const maxWindow = 32 << 20

// Limits that keep what Pack accepts equal to what Unpack accepts, so a
// sandbox that cannot be restored fails at suspend, while it still exists.
const (
	// maxDepth bounds directory nesting: both walks hold an fd per level.
	maxDepth = 1024
	// maxXattrBytes bounds one entry's xattrs: archive/tar refuses PAX
	// headers over 1 MiB when reading.
	maxXattrBytes = 256 << 10
)

// Pack writes dir as a zstd-compressed tar stream to w. Owners are stored
// relative to uidBase; one outside [uidBase, uidBase+size) fails the pack
// with errdefs.ErrInvalidArgument naming the path, as does a device other
// than a whiteout. Sockets are skipped. It returns the size of the
// uncompressed stream and the sha256 of the compressed one.
func Pack(ctx context.Context, w io.Writer, dir string, uidBase, size uint32) (Stats, error) {
	sum := sha256.New()
	cw := &countWriter{w: io.MultiWriter(w, sum)}
	enc, err := zstd.NewWriter(cw, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		return Stats{}, fmt.Errorf("layer: pack: %w", err)
	}
	st, err := packTar(ctx, enc, dir, idMap{base: uidBase, size: size}, nil)
	if cerr := enc.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("layer: pack %s: compress: %w", dir, cerr)
	}
	if err != nil {
		return Stats{}, err
	}
	st.SHA256 = hex.EncodeToString(sum.Sum(nil))
	st.Compressed = cw.n
	return st, nil
}

// Unpack restores a Pack stream into dir, which must be an existing empty
// directory, owning every entry by uidBase plus its stored id. The stream
// is untrusted: entries, symlinks and hard links cannot reach outside dir,
// ids ≥ size and devices other than whiteouts are refused
// (errdefs.ErrInvalidArgument), and more than maxBytes of uncompressed
// stream is errdefs.ErrResourceExhausted. On error dir is left empty.
func Unpack(ctx context.Context, r io.Reader, dir string, uidBase, size uint32, maxBytes int64) (Stats, error) {
	if maxBytes <= 0 {
		return Stats{}, fmt.Errorf("layer: unpack: maxBytes %d: %w", maxBytes, errdefs.ErrInvalidArgument)
	}
	src := &hashReader{r: r, sum: sha256.New()}
	dec, err := zstd.NewReader(src, zstd.WithDecoderMaxWindow(maxWindow))
	if err != nil {
		return Stats{}, fmt.Errorf("layer: unpack: %w", err)
	}
	defer dec.Close()
	st, err := unpackTar(ctx, &decodeReader{r: dec, src: src}, dir, idMap{base: uidBase, size: size}, maxBytes, nil)
	if err != nil {
		return Stats{}, err
	}
	// unpackTar read the decoder to EOF, and the decoder reads its source
	// to EOF (more frames may follow), so the whole input went by. Close
	// waits for the decoder's reading goroutine before src is read here.
	dec.Close()
	st.SHA256 = hex.EncodeToString(src.sum.Sum(nil))
	st.Compressed = src.n
	return st, nil
}

// idMap converts between host ids and ids relative to a sandbox's range.
type idMap struct{ base, size uint32 }

// toRel maps a host id into the range, reporting whether it was inside.
func (m idMap) toRel(host uint32) (int, bool) {
	if host < m.base || uint64(host) >= uint64(m.base)+uint64(m.size) {
		return 0, false
	}
	return int(host - m.base), true
}

// toHost maps a stored id to the host, reporting whether it was valid.
func (m idMap) toHost(rel int) (int, bool) {
	if rel < 0 || int64(rel) >= int64(m.size) {
		return 0, false
	}
	return int(m.base) + rel, true
}

// countWriter counts what goes through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// hashReader hashes and counts the compressed input and remembers its read
// errors, so a failing source is not reported as a malformed archive.
type hashReader struct {
	r   io.Reader
	sum hash.Hash
	n   int64
	err error
}

func (h *hashReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.sum.Write(p[:n])
	h.n += int64(n)
	if err != nil && !errors.Is(err, io.EOF) && h.err == nil {
		h.err = err
	}
	return n, err
}

// decodeReader classifies decoder failures: a source error passes through,
// anything else the decoder rejects is a malformed archive.
type decodeReader struct {
	r   io.Reader
	src *hashReader
}

func (d *decodeReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if err == nil || errors.Is(err, io.EOF) {
		return n, err
	}
	if d.src.err != nil {
		return n, d.src.err
	}
	return n, fmt.Errorf("malformed archive: %w: %w", err, errdefs.ErrInvalidArgument)
}
