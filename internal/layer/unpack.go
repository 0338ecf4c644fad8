package layer

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Confinement. The archive is untrusted (a sandbox wrote the tree it came
// from, and files at rest can be tampered with). Entries must come in the
// order Pack writes them: a directory before its contents, depth first.
// The unpacker keeps an open fd for each directory on the path to the
// current entry, all made by this unpack, and creates each entry with one
// *at call on its final name, with O_EXCL/O_NOFOLLOW semantics, relative to
// its parent's fd. So no path is ever resolved through a symlink: a
// "evil -> /" followed by "evil/tmp/x" fails because "evil" is not a
// directory this archive made. Hard link targets are the only paths looked
// up again, with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS).

// dirEnt is an open directory on the current path.
type dirEnt struct {
	rel   string
	fd    int
	mtime time.Time
}

// unpacker writes tar entries under root.
type unpacker struct {
	ctx   context.Context
	root  int
	ids   idMap
	stack []dirEnt // stack[0] is the root
	rootH *tar.Header
	buf   []byte
	st    Stats
	// direct, in Copy only, holds the sources of files whose content came
	// beside the stream; directBytes counts it.
	direct      *fdQueue
	directBytes int64
}

// unpackTar restores an uncompressed tar stream into the empty directory
// dir. direct is nil except in Copy (see packTar).
func unpackTar(ctx context.Context, r io.Reader, dir string, ids idMap, maxBytes int64, direct *fdQueue) (Stats, error) {
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("layer: unpack into %s: %w", dir, classifyOpen(os.NewSyscallError("open", err)))
	}
	defer unix.Close(root)
	if names, err := readDirNames(root); err != nil || len(names) > 0 {
		if err == nil {
			err = fmt.Errorf("not empty: %w", errdefs.ErrFailedPrecondition)
		}
		return Stats{}, fmt.Errorf("layer: unpack into %s: %w", dir, err)
	}
	cr := &capReader{r: r, max: maxBytes}
	u := &unpacker{ctx: ctx, root: root, ids: ids, stack: []dirEnt{{rel: ".", fd: root}}, direct: direct}
	err = u.run(tar.NewReader(cr))
	if err == nil {
		// The tar end marker and any padding after it count and must be
		// readable (a checksum error of the compression shows here).
		_, err = io.Copy(io.Discard, cr)
	}
	err = u.finish(err)
	if err != nil {
		if cr.over {
			err = fmt.Errorf("archive exceeds %d uncompressed bytes: %w", maxBytes, errdefs.ErrResourceExhausted)
		}
		if rerr := emptyDir(root); rerr != nil {
			err = fmt.Errorf("%w (and cleaning up failed: %v)", err, rerr)
		}
		return Stats{}, fmt.Errorf("layer: unpack into %s: %w", dir, err)
	}
	u.st.Bytes = cr.n + u.directBytes
	return u.st, nil
}

// run applies every entry of the archive.
func (u *unpacker) run(tr *tar.Reader) error {
	for first := true; ; first = false {
		if err := u.ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return malformed(err)
		}
		if err := u.entry(hdr, tr, first); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
}

// finish closes the directories still open and, when all went well, gives
// the root its stored metadata: only now, so a failed unpack leaves the
// root as it found it.
func (u *unpacker) finish(err error) error {
	for len(u.stack) > 1 {
		if perr := u.pop(err == nil); err == nil {
			err = perr
		}
	}
	if err != nil || u.rootH == nil {
		return err
	}
	if err := u.meta(u.root, u.rootH); err != nil {
		return fmt.Errorf("root: %w", err)
	}
	return unix.UtimesNanoAt(u.root, ".", times(u.rootH), 0)
}

// entry applies one header.
func (u *unpacker) entry(hdr *tar.Header, r io.Reader, first bool) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if err := u.checkHeader(hdr); err != nil {
		return err
	}
	if rel == "." {
		if !first || hdr.Typeflag != tar.TypeDir {
			return unsafeEntry("the root may only be the first entry, as a directory")
		}
		u.rootH = hdr
		u.st.Dirs++
		return nil
	}
	pfd, err := u.parent(path.Dir(rel))
	if err != nil {
		return err
	}
	base := path.Base(rel)
	switch hdr.Typeflag {
	case tar.TypeDir:
		err = u.mkdir(pfd, base, rel, hdr)
	case tar.TypeReg:
		err = u.file(pfd, base, hdr, r)
	case tar.TypeSymlink:
		err = u.symlink(pfd, base, hdr)
	case tar.TypeLink:
		err = u.hardlink(pfd, base, hdr)
	case tar.TypeFifo, tar.TypeChar:
		err = u.special(pfd, base, hdr)
	default:
		err = unsafeEntry("type %q is not allowed", hdr.Typeflag)
	}
	return classify(err)
}

// checkHeader refuses what no faithful archive holds: ids outside the
// range, devices other than whiteouts, xattrs outside user.* (a
// security.capability or trusted.overlay.* would grant what the sandbox
// never had) or on a file kind the kernel gives no user.* xattrs.
func (u *unpacker) checkHeader(hdr *tar.Header) error {
	if _, ok := u.ids.toHost(hdr.Uid); !ok {
		return unsafeEntry("uid %d outside [0, %d)", hdr.Uid, u.ids.size)
	}
	if _, ok := u.ids.toHost(hdr.Gid); !ok {
		return unsafeEntry("gid %d outside [0, %d)", hdr.Gid, u.ids.size)
	}
	switch {
	case hdr.Typeflag == tar.TypeBlock:
		return unsafeEntry("block device %d:%d", hdr.Devmajor, hdr.Devminor)
	case hdr.Typeflag == tar.TypeChar && (hdr.Devmajor != 0 || hdr.Devminor != 0):
		return unsafeEntry("device %d:%d is not a whiteout", hdr.Devmajor, hdr.Devminor)
	}
	for k := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, paxXattr)
		if !ok {
			continue
		}
		if !strings.HasPrefix(name, xattrPrefix) {
			return unsafeEntry("xattr %q is outside the user namespace", name)
		}
		if hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeDir {
			return unsafeEntry("xattr %q on an entry of type %q", name, hdr.Typeflag)
		}
	}
	return nil
}

// parent returns the fd of directory rel, which must be on the current
// path: directories still open further down are finished on the way.
func (u *unpacker) parent(rel string) (int, error) {
	for {
		top := u.stack[len(u.stack)-1]
		if top.rel == rel {
			return top.fd, nil
		}
		if len(u.stack) == 1 || strings.HasPrefix(rel, top.rel+"/") {
			return -1, unsafeEntry("parent %q is not a directory made earlier by this archive", rel)
		}
		if err := u.pop(true); err != nil {
			return -1, err
		}
	}
}

// pop closes the innermost open directory, first giving it its mtime when
// setTime: nothing is written into it any more.
func (u *unpacker) pop(setTime bool) error {
	top := u.stack[len(u.stack)-1]
	u.stack = u.stack[:len(u.stack)-1]
	defer unix.Close(top.fd)
	if !setTime {
		return nil
	}
	ts := timespecs(top.mtime)
	pfd := u.stack[len(u.stack)-1].fd
	if err := unix.UtimesNanoAt(pfd, path.Base(top.rel), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %q: %w", top.rel, os.NewSyscallError("utimensat", err))
	}
	return nil
}

func (u *unpacker) mkdir(pfd int, base, rel string, hdr *tar.Header) error {
	if len(u.stack) > maxDepth {
		return unsafeEntry("nested deeper than %d levels", maxDepth)
	}
	if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
		return os.NewSyscallError("mkdirat", err)
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("openat", err)
	}
	u.stack = append(u.stack, dirEnt{rel: rel, fd: fd, mtime: hdr.ModTime})
	u.st.Dirs++
	return u.meta(fd, hdr)
}

func (u *unpacker) file(pfd int, base string, hdr *tar.Header, r io.Reader) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return os.NewSyscallError("openat", err)
	}
	if v, ok := hdr.PAXRecords[directKey]; ok {
		err = u.copyDirect(fd, v)
	} else {
		err = u.content(fd, hdr.Size, r)
	}
	if err == nil {
		err = u.meta(fd, hdr)
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	if _, ok := hdr.PAXRecords[paxXattr+whiteoutXattr]; ok {
		u.st.Whiteouts++
	} else {
		u.st.Files++
	}
	return setTimes(pfd, base, hdr)
}

// content copies size bytes of r into fd, leaving zero blocks as holes.
func (u *unpacker) content(fd int, size int64, r io.Reader) error {
	if u.buf == nil {
		u.buf = make([]byte, 256<<10)
	}
	var off int64
	for off < size {
		if err := u.ctx.Err(); err != nil {
			return err
		}
		n, err := io.ReadFull(r, u.buf[:min(int64(len(u.buf)), size-off)])
		if err != nil {
			return malformed(err)
		}
		if err := writeSparse(fd, u.buf[:n], off); err != nil {
			return err
		}
		off += int64(n)
	}
	return os.NewSyscallError("ftruncate", unix.Ftruncate(fd, size))
}

func (u *unpacker) symlink(pfd int, base string, hdr *tar.Header) error {
	if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
		return unsafeEntry("symlink without a valid target")
	}
	// The target is stored as is, absolute ones included: it is never
	// followed here, and inside the sandbox it resolves in its own root.
	if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
		return os.NewSyscallError("symlinkat", err)
	}
	u.st.Files++
	return u.ownAt(pfd, base, hdr, false)
}

// hardlink links base to an earlier non-directory of the archive, named
// relative to the root like an entry.
func (u *unpacker) hardlink(pfd int, base string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil || target == "." {
		return unsafeEntry("hard link target %q", hdr.Linkname)
	}
	ofd, err := openBeneath(u.root, path.Dir(target))
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", target, err)
	}
	defer unix.Close(ofd)
	var st unix.Stat_t
	if err := unix.Fstatat(ofd, path.Base(target), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("hard link target %q: %w", target, os.NewSyscallError("fstatat", err))
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return unsafeEntry("hard link to directory %q", target)
	}
	// Flags 0: a symlink target is linked itself, never followed.
	if err := unix.Linkat(ofd, path.Base(target), pfd, base, 0); err != nil {
		return os.NewSyscallError("linkat", err)
	}
	u.st.Links++
	return nil
}

// special makes a fifo or a whiteout (checkHeader allowed only 0:0).
func (u *unpacker) special(pfd int, base string, hdr *tar.Header) error {
	mode := uint32(unix.S_IFIFO)
	if hdr.Typeflag == tar.TypeChar {
		mode = unix.S_IFCHR
	}
	if err := unix.Mknodat(pfd, base, mode|0o600, 0); err != nil {
		return os.NewSyscallError("mknodat", err)
	}
	if hdr.Typeflag == tar.TypeChar {
		u.st.Whiteouts++
	} else {
		u.st.Files++
	}
	return u.ownAt(pfd, base, hdr, true)
}

// ownAt sets owner, then mode (chmod), then times of a name that cannot be
// opened to do so: a symlink, or a fifo (opening it would block).
func (u *unpacker) ownAt(pfd int, base string, hdr *tar.Header, chmod bool) error {
	uid, _ := u.ids.toHost(hdr.Uid)
	gid, _ := u.ids.toHost(hdr.Gid)
	if err := unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return os.NewSyscallError("fchownat", err)
	}
	// base was just made by mknodat in a directory of this unpack, so the
	// (necessarily following) fchmodat reaches it.
	if chmod {
		if err := unix.Fchmodat(pfd, base, uint32(hdr.Mode)&0o7777, 0); err != nil {
			return os.NewSyscallError("fchmodat", err)
		}
	}
	return setTimes(pfd, base, hdr)
}

// meta sets xattrs, owner, then mode of fd: chown clears setuid and
// setgid, so the mode comes last.
func (u *unpacker) meta(fd int, hdr *tar.Header) error {
	for k, v := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, paxXattr); ok {
			if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil {
				return os.NewSyscallError("fsetxattr "+name, err)
			}
		}
	}
	uid, _ := u.ids.toHost(hdr.Uid)
	gid, _ := u.ids.toHost(hdr.Gid)
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return os.NewSyscallError("fchown", err)
	}
	return os.NewSyscallError("fchmod", unix.Fchmod(fd, uint32(hdr.Mode)&0o7777))
}

// setTimes gives base the entry's mtime (and the same atime: atimes are
// not archived, they change on every read and would make archives differ).
func setTimes(pfd int, base string, hdr *tar.Header) error {
	return os.NewSyscallError("utimensat", unix.UtimesNanoAt(pfd, base, times(hdr), unix.AT_SYMLINK_NOFOLLOW))
}

func times(hdr *tar.Header) []unix.Timespec { return timespecs(hdr.ModTime) }

func timespecs(t time.Time) []unix.Timespec {
	// Not UnixNano: a hostile mtime past 2262 must not overflow.
	ts := unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
	return []unix.Timespec{ts, ts}
}

// cleanName validates an entry name: relative, no NUL, no ".." and already
// in clean form (as Pack writes it; a directory may end in "/").
func cleanName(name string) (string, error) {
	trimmed := strings.TrimSuffix(name, "/")
	if trimmed == "" && name == "/" {
		return "", unsafeEntry("path %q is absolute", name)
	}
	switch {
	case name == "" || strings.ContainsRune(name, 0):
		return "", unsafeEntry("path %q is empty or has a NUL byte", name)
	case path.IsAbs(name):
		return "", unsafeEntry("path %q is absolute", name)
	case trimmed == ".." || strings.HasPrefix(trimmed, "../"):
		return "", unsafeEntry("path %q leaves the root", name)
	case path.Clean(trimmed) != trimmed:
		return "", unsafeEntry("path %q is not in clean form", name)
	}
	return trimmed, nil
}

func unsafeEntry(format string, args ...any) error {
	return fmt.Errorf("unsafe entry: %s: %w", fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

// malformed classifies a failure to parse the stream: a truncated or
// corrupt archive is invalid input; other errors (the source failing, the
// size cap, a classified decode error) pass through.
func malformed(err error) error {
	if errors.Is(err, errdefs.ErrInvalidArgument) {
		return err // the decoder's verdict, already classified
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, tar.ErrHeader) ||
		errors.Is(err, tar.ErrFieldTooLong) || errors.Is(err, tar.ErrInsecurePath) {
		return fmt.Errorf("malformed archive: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return err
}

// capReader fails once more than max bytes went through.
type capReader struct {
	r    io.Reader
	max  int64
	n    int64
	over bool
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.over {
		return 0, fmt.Errorf("more than %d bytes: %w", c.max, errdefs.ErrResourceExhausted)
	}
	if left := c.max - c.n; int64(len(p)) > left {
		p = p[:left+1] // one more byte tells "over" from "exactly max"
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.max {
		c.over = true
		return n, fmt.Errorf("more than %d bytes: %w", c.max, errdefs.ErrResourceExhausted)
	}
	return n, err
}
