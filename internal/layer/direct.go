package layer

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Copy sends the content of large regular files beside the tar stream, not
// through it: the packer hands the unpacker the file's descriptor (opened
// and checked by its confined walk), and the unpacker copies from it into
// the file it made with copy_file_range(2), which copies in the kernel, or
// shares the blocks on filesystems with reflinks (XFS, btrfs). The stream
// carries only the header, with the size in a PAX record that nothing but
// Copy's own unpacker accepts: an archive read by Unpack that has it is
// refused.

// directMin is the smallest file whose content goes beside the stream.
const directMin = 1 << 20

// directKey is the PAX record naming a file's size whose content goes
// beside the stream.
const directKey = "HUTCH.direct"

// fdQueue passes descriptors from the packer to the unpacker, in the order
// of the entries they belong to. It never blocks: the packer pushes before
// writing the header, which the unpacker reads only later.
type fdQueue struct {
	mu  sync.Mutex
	fds []int
}

func (q *fdQueue) push(fd int) {
	q.mu.Lock()
	q.fds = append(q.fds, fd)
	q.mu.Unlock()
}

func (q *fdQueue) pop() (int, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.fds) == 0 {
		return -1, false
	}
	fd := q.fds[0]
	q.fds = q.fds[1:]
	return fd, true
}

// closeAll closes what was pushed and never popped (a copy that failed).
func (q *fdQueue) closeAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, fd := range q.fds {
		unix.Close(fd)
	}
	q.fds = nil
}

// queueContent queues a duplicate of fd for the unpacker, before the
// header that names it is written.
func (p *packer) queueContent(fd int) error {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("fcntl", err)
	}
	p.direct.push(dup)
	return nil
}

// copyDirect fills dst, a file the unpacker just made, from the next
// queued descriptor: size bytes, keeping the source's holes.
func (u *unpacker) copyDirect(dst int, v string) error {
	size, err := strconv.ParseInt(v, 10, 64)
	if u.direct == nil || err != nil || size < 0 {
		return unsafeEntry("record %s=%q is not allowed here", directKey, v)
	}
	src, ok := u.direct.pop()
	if !ok {
		return fmt.Errorf("no descriptor for a file copied beside the stream")
	}
	defer unix.Close(src)
	for off := int64(0); off < size; {
		data, err := unix.Seek(src, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			data = off // no SEEK_DATA here: copy everything
		}
		if data >= size {
			break
		}
		hole, err := unix.Seek(src, data, unix.SEEK_HOLE)
		if err != nil || hole > size {
			hole = size
		}
		if err := u.copyRange(src, dst, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return os.NewSyscallError("fstat", err)
	}
	if st.Size != size {
		return fmt.Errorf("changed size to %d bytes while copied: %w", st.Size, errdefs.ErrFailedPrecondition)
	}
	u.directBytes += size
	return os.NewSyscallError("ftruncate", unix.Ftruncate(dst, size))
}

// copyRange copies n bytes at off from src to dst, in the kernel where it
// can, else through a buffer.
func (u *unpacker) copyRange(src, dst int, off, n int64) error {
	for n > 0 {
		if err := u.ctx.Err(); err != nil {
			return err
		}
		in, out := off, off
		k, err := unix.CopyFileRange(src, &in, dst, &out, int(min(n, 64<<20)), 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EXDEV), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP),
			errors.Is(err, unix.EINVAL):
			return u.preadRange(src, dst, off, n)
		case err != nil:
			return os.NewSyscallError("copy_file_range", err)
		case k == 0:
			return fmt.Errorf("shrank while copied: %w", errdefs.ErrFailedPrecondition)
		}
		off, n = off+int64(k), n-int64(k)
	}
	return nil
}

// preadRange is copyRange through a buffer.
func (u *unpacker) preadRange(src, dst int, off, n int64) error {
	if u.buf == nil {
		u.buf = make([]byte, 256<<10)
	}
	for n > 0 {
		if err := u.ctx.Err(); err != nil {
			return err
		}
		k, err := unix.Pread(src, u.buf[:min(n, int64(len(u.buf)))], off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return os.NewSyscallError("pread", err)
		}
		if k == 0 {
			return fmt.Errorf("shrank while copied: %w", errdefs.ErrFailedPrecondition)
		}
		if err := pwriteAll(dst, u.buf[:k], off); err != nil {
			return err
		}
		off, n = off+int64(k), n-int64(k)
	}
	return nil
}
