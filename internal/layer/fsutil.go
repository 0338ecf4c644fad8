package layer

import (
	"errors"
	"fmt"
	"github.com/hutch-dev/hutch/internal/fsat"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// openNoATime opens name under dirfd without following a final symlink and
// without touching its atime (O_NOATIME needs ownership or CAP_FOWNER; it
// is dropped when refused).
func openNoATime(dirfd int, name string, flags int) (int, error) {
	flags |= unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	for {
		fd, err := unix.Openat(dirfd, name, flags|unix.O_NOATIME, 0)
		if errors.Is(err, unix.EPERM) {
			fd, err = unix.Openat(dirfd, name, flags, 0)
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return -1, os.NewSyscallError("openat", err)
		}
		return fd, nil
	}
}

// classifyOpen maps a missing directory to ErrNotFound.
func classifyOpen(err error) error {
	if errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	}
	return err
}

// classify gives the error class of a failed write while unpacking: what
// the archive caused (a duplicate name, a name through a symlink or a
// non-directory, a missing link target) is ErrInvalidArgument, a full
// disk is ErrResourceExhausted. The errno stays in the chain.
func classify(err error) error {
	switch {
	case err == nil, errors.Is(err, errdefs.ErrInvalidArgument), errors.Is(err, errdefs.ErrResourceExhausted):
		return err
	case errors.Is(err, unix.EEXIST), errors.Is(err, unix.EXDEV), errors.Is(err, unix.ELOOP),
		errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ENAMETOOLONG), errors.Is(err, unix.ENOENT),
		errors.Is(err, unix.EISDIR):
		return fmt.Errorf("unsafe or malformed entry: %w: %w", err, errdefs.ErrInvalidArgument)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT), errors.Is(err, unix.EMLINK):
		return fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
	}
	return err
}

// openBeneath opens the directory rel under root: no step may leave root
// or go through any symlink at all, since a tree unpacked here never needs
// one to reach its own directories.
func openBeneath(root int, rel string) (int, error) {
	return fsat.OpenBeneath(root, rel, unix.RESOLVE_NO_SYMLINKS|unix.RESOLVE_NO_MAGICLINKS|unix.RESOLVE_NO_XDEV)
}

var (
	readDirNames = fsat.ReadDirNames
	removeAt     = fsat.RemoveAt
)

// emptyDir removes everything inside the directory fd.
func emptyDir(fd int) error {
	names, err := readDirNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := removeAt(fd, n); err != nil {
			return err
		}
	}
	return nil
}

// listXattrs returns the user.* xattrs of fd. Other namespaces are not
// the sandbox's to set (trusted.*, security.*) and are left out.
func listXattrs(fd int) (map[string]string, error) {
	buf, err := grow(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) })
	if err != nil {
		return nil, os.NewSyscallError("flistxattr", err)
	}
	var out map[string]string
	for name := range strings.SplitSeq(string(buf), "\x00") {
		if !strings.HasPrefix(name, xattrPrefix) {
			continue
		}
		value, err := grow(func(b []byte) (int, error) { return unix.Fgetxattr(fd, name, b) })
		if errors.Is(err, unix.ENODATA) {
			continue // removed since listed
		}
		if err != nil {
			return nil, os.NewSyscallError("fgetxattr "+name, err)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[name] = string(value)
	}
	return out, nil
}

// grow calls f with a buffer of the size f reports for a nil one, again
// when the value grew in between (ERANGE).
func grow(f func([]byte) (int, error)) ([]byte, error) {
	for tries := 0; ; tries++ {
		n, err := f(nil)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, nil
		}
		b := make([]byte, n)
		n, err = f(b)
		if errors.Is(err, unix.ERANGE) && tries < 8 {
			continue
		}
		if err != nil {
			return nil, err
		}
		return b[:n], nil
	}
}

// readlinkat returns the target of the symlink name in dirfd.
func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		b := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, b)
		if err != nil {
			return "", os.NewSyscallError("readlinkat", err)
		}
		if n < size {
			return string(b[:n]), nil
		}
	}
}

// fdReader reads a file descriptor it does not own.
type fdReader int

func (fd fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(int(fd), p)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, os.NewSyscallError("read", err)
		}
		if n == 0 && len(p) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

// sparseBlock is the granularity at which runs of zeros become holes.
const sparseBlock = 4096

// writeSparse writes p at off, skipping whole blocks of zeros so they stay
// holes (the file is extended to its size with ftruncate at the end).
// Archives store sparse files in full; zstd makes the zeros nearly free.
func writeSparse(fd int, p []byte, off int64) error {
	for len(p) > 0 {
		n := min(len(p), sparseBlock)
		if isZero(p[:n]) {
			p, off = p[n:], off+int64(n)
			continue
		}
		for n < len(p) && !isZero(p[n:min(n+sparseBlock, len(p))]) {
			n = min(n+sparseBlock, len(p))
		}
		if err := pwriteAll(fd, p[:n], off); err != nil {
			return err
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

func pwriteAll(fd int, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pwrite(fd, p, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return os.NewSyscallError("pwrite", err)
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

var zeros [sparseBlock]byte

func isZero(b []byte) bool { return string(b) == string(zeros[:len(b)]) }
