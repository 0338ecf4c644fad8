package imagefs

import (
	"errors"
	"fmt"
	"os"
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

// openBeneath opens directory rel under dirfd with openat2(RESOLVE_BENEATH).
func openBeneath(dirfd int, rel string) (int, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	}
	for tries := 0; ; tries++ {
		fd, err := unix.Openat2(dirfd, rel, &how)
		// EAGAIN: a concurrent rename raced a ".." step; EINTR: a signal.
		if (errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR)) && tries < 16 {
			continue
		}
		if err != nil {
			return -1, os.NewSyscallError("openat2", err)
		}
		return fd, nil
	}
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

// removeAt deletes name in dirfd and, if it is a directory, everything in
// it. Symlinks are removed, never followed. A missing name is no error.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return os.NewSyscallError("unlinkat", err)
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("openat", err)
	}
	names, err := readDirNames(fd)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n); err != nil {
				break
			}
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	return os.NewSyscallError("unlinkat", unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR))
}

// readDirNames lists the directory fd (which stays open) without "." and "..".
func readDirNames(fd int) ([]string, error) {
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("openat", err)
	}
	f := os.NewFile(uintptr(dup), ".")
	defer f.Close()
	return f.Readdirnames(-1)
}
