package imagefs

import (
	"errors"
	"fmt"
	"github.com/hutch-dev/hutch/internal/fsat"
	"path"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Confinement. Every write is an *at syscall on a final name component
// (with O_NOFOLLOW / AT_SYMLINK_NOFOLLOW / O_EXCL, so a symlink there is
// replaced, never followed) relative to a parent directory fd. Parent fds
// come only from openat2 on the root fd with RESOLVE_BENEATH: the kernel
// follows symlinks inside the tree (a usr-merged "lib -> usr/lib" works) but
// fails with EXDEV when any step would leave it, an absolute symlink ("etc
// -> /") or ".." past the root. So a layer that plants "evil -> /" and then
// writes "evil/tmp/x" fails instead of writing the host's /tmp/x.
//
// RESOLVE_IN_ROOT was the other choice: it would resolve "evil/tmp/x" to
// <root>/tmp/x, as a runtime inside the container would. That is safe too
// but silently rewrites a malicious entry; failing the image is more honest.
// The cost: an image that writes through an absolute symlink of its own
// (a later layer adding "var/run/x" over "var/run -> /run") is rejected,
// which images built by diffing a filesystem do not produce. os.Root has
// the same semantics, but its escape error is unexported, so it could not
// be told apart from an I/O error without matching strings.

// openDir opens the directory rel of the tree (confined, see above). With
// create, missing directories are made (root-owned, 0755).
func (a *applier) openDir(rel string, create bool) (int, error) {
	fd, err := openBeneath(a.root, rel)
	if err == nil {
		return fd, nil
	}
	if !create || !errors.Is(err, unix.ENOENT) || rel == "." {
		return -1, classify(err)
	}
	pfd, err := a.openDir(path.Dir(rel), true)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	made := true
	if err := unix.Mkdirat(pfd, path.Base(rel), 0o755); errors.Is(err, unix.EEXIST) {
		made = false // e.g. a dangling symlink; resolution below decides
	} else if err != nil {
		return -1, err
	}
	fd, err = openBeneath(a.root, rel)
	if err != nil {
		return -1, classify(err)
	}
	if made {
		if err := unix.Fchmod(fd, 0o755); err != nil { // undo the umask
			unix.Close(fd)
			return -1, err
		}
	}
	return fd, nil
}

// classify marks resolution failures caused by the image as
// ErrInvalidArgument: escaping the root (EXDEV), symlink loops or magic
// links (ELOOP), a non-directory used as a directory (ENOTDIR), a name too
// long (ENAMETOOLONG). The errno stays in the chain.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("unsafe entry: path escapes the root through a symlink or \"..\" (%w): %w", err, errdefs.ErrInvalidArgument)
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ENAMETOOLONG):
		return fmt.Errorf("malformed image: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return err
}

// openBeneath opens directory rel under dirfd: no step may leave it.
func openBeneath(dirfd int, rel string) (int, error) {
	return fsat.OpenBeneath(dirfd, rel, unix.RESOLVE_NO_MAGICLINKS)
}

var (
	readDirNames = fsat.ReadDirNames
	removeAt     = fsat.RemoveAt
)
