package imagefs

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

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Layers are applied here rather than with mutate.Extract. Extract
// flattens by walking the layers top-down and emitting each path's newest
// entry, so a hard link in an upper layer whose target comes from a lower
// layer is emitted before that target (an in-order unpacker then fails),
// and it silently drops escaping links instead of failing the image. Its
// output would also still need the confined writer below. Applying each
// layer in order over the tree, as containerd and docker do, gets hard
// links, whiteouts and opaque dirs right by construction.

const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh." // aufs metadata, and the opaque marker
	opaqueMarker   = ".wh..wh..opq"
)

// applier writes layers into the tree under root, an fd of the destination.
type applier struct {
	ctx  context.Context
	root int
	// layer holds the paths the current layer wrote, and their ancestors:
	// whiteouts and opaque markers hide lower layers only.
	layer map[string]bool
	// dirTimes holds directory times, set last because creating entries
	// inside a directory changes its mtime.
	dirTimes map[string][]unix.Timespec
}

// extract applies img's layers in order into the existing directory dst.
func extract(ctx context.Context, img v1.Image, dst string) error {
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("imagefs: %w", malformed("layers", err))
	}
	root, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("imagefs: open destination: %w", err)
	}
	defer unix.Close(root)
	a := &applier{ctx: ctx, root: root, dirTimes: map[string][]unix.Timespec{}}
	for i, l := range layers {
		if err := a.applyLayer(l); err != nil {
			return fmt.Errorf("imagefs: layer %d: %w", i, err)
		}
	}
	if err := a.setDirTimes(); err != nil {
		return fmt.Errorf("imagefs: %w", err)
	}
	return nil
}

func (a *applier) applyLayer(l v1.Layer) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return malformed("layer blob", err)
	}
	defer rc.Close()
	a.layer = map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		if err := a.ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return malformed("layer tar", err)
		}
		if err := a.apply(hdr, tr); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	// Read to the end so a digest mismatch of the blob surfaces.
	if _, err := io.Copy(io.Discard, rc); err != nil {
		return malformed("layer blob", err)
	}
	return nil
}

// apply writes one tar entry.
func (a *applier) apply(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanPath(hdr.Name)
	if err != nil {
		return err
	}
	if base := path.Base(rel); strings.HasPrefix(base, whiteoutPrefix) {
		return a.whiteout(path.Dir(rel), base)
	}
	if rel == "." {
		return a.rootEntry(hdr)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		a.mark(rel)
		return a.mkdir(rel, hdr)
	case tar.TypeReg, tar.TypeGNUSparse:
		a.mark(rel)
		return a.file(rel, hdr, r)
	case tar.TypeSymlink:
		a.mark(rel)
		return a.symlink(rel, hdr)
	case tar.TypeLink:
		a.mark(rel)
		return a.hardlink(rel, hdr)
	case tar.TypeFifo:
		a.mark(rel)
		return a.fifo(rel, hdr)
	}
	// Character and block devices (and unknown types) are skipped: a
	// sandbox gets its /dev from the runtime, not from the image.
	return nil
}

// cleanPath validates an entry name and returns it cleaned and relative.
func cleanPath(name string) (string, error) {
	switch {
	case name == "" || strings.ContainsRune(name, 0):
		return "", unsafeEntry("path %q is empty or has a NUL byte", name)
	case path.IsAbs(name):
		return "", unsafeEntry("path %q is absolute", name)
	}
	c := path.Clean(name)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", unsafeEntry("path %q leaves the root", name)
	}
	return c, nil
}

func unsafeEntry(format string, args ...any) error {
	return fmt.Errorf("unsafe entry: %s: %w", fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

// mark records rel and its ancestors as written by the current layer.
func (a *applier) mark(rel string) {
	for p := rel; !a.layer[p]; p = path.Dir(p) {
		a.layer[p] = true
		if p == "." {
			return
		}
	}
}

// whiteout applies ".wh.<name>" (delete name) or the opaque marker.
func (a *applier) whiteout(dir, base string) error {
	if base == opaqueMarker {
		a.mark(dir)
		fd, err := a.openDir(dir, true)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return a.clearLower(fd, dir)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil
	}
	victim := strings.TrimPrefix(base, whiteoutPrefix)
	if victim == "" || victim == "." || victim == ".." {
		return unsafeEntry("whiteout %q names no file", base)
	}
	fd, err := a.openDir(dir, false)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil // nothing to delete
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if p := path.Join(dir, victim); a.layer[p] {
		// This layer also wrote p: keep that, hide only what is older.
		return a.clearLowerAt(fd, victim, p)
	}
	return classify(removeAt(fd, victim))
}

// clearLower removes everything under the directory fd (at rel) that the
// current layer did not write: the effect of an opaque marker.
func (a *applier) clearLower(fd int, rel string) error {
	names, err := readDirNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(rel, n)
		if !a.layer[p] {
			if err := removeAt(fd, n); err != nil {
				return err
			}
			continue
		}
		if err := a.clearLowerAt(fd, n, p); err != nil {
			return err
		}
	}
	return nil
}

// clearLowerAt runs clearLower on the child name of dirfd if it is a
// directory; other kinds of files are left alone.
func (a *applier) clearLowerAt(dirfd int, name, rel string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return a.clearLower(fd, rel)
}

// rootEntry applies a "./" entry's owner, mode and times to the root.
func (a *applier) rootEntry(hdr *tar.Header) error {
	if hdr.Typeflag != tar.TypeDir {
		return unsafeEntry("the root is not a directory")
	}
	a.dirTimes["."] = times(hdr)
	return setOwnerMode(a.root, hdr)
}

// prepare opens rel's parent, creating missing directories, and removes
// whatever is at rel unless both it and the new entry are directories. It
// returns the parent fd and whether a directory was kept.
func (a *applier) prepare(rel string, isDir bool) (int, bool, error) {
	pfd, err := a.openDir(path.Dir(rel), true)
	if err != nil {
		return -1, false, err
	}
	base := path.Base(rel)
	var st unix.Stat_t
	err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case errors.Is(err, unix.ENOENT):
		return pfd, false, nil
	case err != nil:
	case isDir && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return pfd, true, nil
	default:
		err = removeAt(pfd, base)
	}
	if err != nil {
		unix.Close(pfd)
		return -1, false, err
	}
	return pfd, false, nil
}

func (a *applier) mkdir(rel string, hdr *tar.Header) error {
	pfd, kept, err := a.prepare(rel, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	base := path.Base(rel)
	if !kept {
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return os.NewSyscallError("mkdirat", err)
		}
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("openat", err)
	}
	defer unix.Close(fd)
	a.dirTimes[rel] = times(hdr)
	return setOwnerMode(fd, hdr)
}

func (a *applier) file(rel string, hdr *tar.Header, r io.Reader) error {
	pfd, _, err := a.prepare(rel, false)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	base := path.Base(rel)
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return os.NewSyscallError("openat", err)
	}
	f := os.NewFile(uintptr(fd), rel)
	_, err = io.Copy(f, r)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = malformed("layer tar", err)
	}
	if err == nil {
		err = setOwnerMode(fd, hdr)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return unix.UtimesNanoAt(pfd, base, times(hdr), unix.AT_SYMLINK_NOFOLLOW)
}

func (a *applier) symlink(rel string, hdr *tar.Header) error {
	if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
		return unsafeEntry("symlink without a valid target")
	}
	pfd, _, err := a.prepare(rel, false)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	base := path.Base(rel)
	// The target is stored as is (absolute ones included): it is never
	// followed here, and inside the sandbox it resolves in its own root.
	if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
		return os.NewSyscallError("symlinkat", err)
	}
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	return unix.UtimesNanoAt(pfd, base, times(hdr), unix.AT_SYMLINK_NOFOLLOW)
}

// hardlink links rel to an existing non-directory inside the tree. The
// target name is relative to the root, like an entry name.
func (a *applier) hardlink(rel string, hdr *tar.Header) error {
	target, err := cleanPath(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link target: %w", err)
	}
	if target == rel {
		return nil
	}
	ofd, err := a.openDir(path.Dir(target), false)
	if err != nil {
		return missingTarget(target, err)
	}
	defer unix.Close(ofd)
	obase := path.Base(target)
	var st unix.Stat_t
	if err := unix.Fstatat(ofd, obase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return missingTarget(target, err)
	}
	if target == "." || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return unsafeEntry("hard link to directory %q", target)
	}
	pfd, _, err := a.prepare(rel, false)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	// Flags 0: a symlink target is linked itself, never followed.
	if err := unix.Linkat(ofd, obase, pfd, path.Base(rel), 0); err != nil {
		return missingTarget(target, err)
	}
	return nil
}

func missingTarget(target string, err error) error {
	if errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("hard link target %q does not exist: %w", target, errdefs.ErrInvalidArgument)
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		err = classify(err)
	}
	return fmt.Errorf("hard link target %q: %w", target, err)
}

func (a *applier) fifo(rel string, hdr *tar.Header) error {
	pfd, _, err := a.prepare(rel, false)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	base := path.Base(rel)
	if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
		return os.NewSyscallError("mknodat", err)
	}
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	// Opening a fifo to fchmod it would block; base is the fifo just made.
	if err := unix.Fchmodat(pfd, base, mode(hdr), 0); err != nil {
		return err
	}
	return unix.UtimesNanoAt(pfd, base, times(hdr), unix.AT_SYMLINK_NOFOLLOW)
}

// setOwnerMode chowns then chmods fd: chown clears setuid/setgid bits, so
// the mode must come second.
func setOwnerMode(fd int, hdr *tar.Header) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	return unix.Fchmod(fd, mode(hdr))
}

// mode is the permission part of a tar mode, with setuid, setgid, sticky.
func mode(hdr *tar.Header) uint32 { return uint32(hdr.Mode) & 0o7777 }

// times returns the atime/mtime pair of an entry for utimensat.
func times(hdr *tar.Header) []unix.Timespec {
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	return []unix.Timespec{timespec(at), timespec(hdr.ModTime)}
}

func timespec(t time.Time) unix.Timespec {
	ts, err := unix.TimeToTimespec(t)
	if err != nil || t.IsZero() {
		return unix.Timespec{}
	}
	return ts
}

// setDirTimes gives the directories their recorded times, once nothing
// more is written into them.
func (a *applier) setDirTimes() error {
	for rel, ts := range a.dirTimes {
		if err := a.setDirTime(rel, ts); err != nil {
			return fmt.Errorf("set times of %q: %w", rel, err)
		}
	}
	return nil
}

func (a *applier) setDirTime(rel string, ts []unix.Timespec) error {
	if rel == "." {
		return unix.UtimesNanoAt(a.root, ".", ts, 0)
	}
	pfd, err := a.openDir(path.Dir(rel), false)
	if err != nil {
		return nil // removed or replaced by a later layer
	}
	defer unix.Close(pfd)
	base := path.Base(rel)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	return unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
}
