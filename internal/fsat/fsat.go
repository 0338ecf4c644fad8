// Package fsat holds the fd-relative file helpers that the code writing
// untrusted trees to disk (image layers, sandbox archives) shares: every
// step is taken from an open directory fd, so no path can be redirected by
// a symlink planted in the tree being written.
package fsat

import (
	"errors"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// OpenBeneath opens directory rel under dirfd with openat2 and the given
// RESOLVE_* flags (RESOLVE_BENEATH is always added): no step may leave
// dirfd. It retries the transient EAGAIN (a rename raced a ".." step) and
// EINTR.
func OpenBeneath(dirfd int, rel string, resolve uint64) (int, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | resolve,
	}
	for tries := 0; ; tries++ {
		fd, err := unix.Openat2(dirfd, rel, &how)
		if (errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR)) && tries < 16 {
			continue
		}
		if err != nil {
			return -1, os.NewSyscallError("openat2", err)
		}
		return fd, nil
	}
}

// ReadDirNames lists the directory fd (which stays open and is read from
// the start) in byte order, without "." and "..".
func ReadDirNames(fd int) ([]string, error) {
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("openat", err)
	}
	f := os.NewFile(uintptr(dup), ".")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

// RemoveAt deletes name in dirfd and, if it is a directory, everything in
// it. Symlinks are removed, never followed. A missing name is no error.
func RemoveAt(dirfd int, name string) error {
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
	names, err := ReadDirNames(fd)
	if err == nil {
		for _, n := range names {
			if err = RemoveAt(fd, n); err != nil {
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
