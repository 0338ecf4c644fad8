package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// mount is one cgroup or cgroup2 mount from /proc/self/mountinfo.
type mount struct {
	point, root, fstype string
	opts                []string // super options: the v1 controllers, among others
}

// dir maps a cgroup path (as in /proc/self/cgroup) to its directory under
// the mount point; false when the path is outside what the mount shows.
func (m mount) dir(cgPath string) (string, bool) {
	rel := cgPath
	if m.root != "/" {
		if cgPath != m.root && !strings.HasPrefix(cgPath, m.root+"/") {
			return "", false
		}
		rel = strings.TrimPrefix(cgPath, m.root)
	}
	return filepath.Join(m.point, rel), true
}

// readMounts lists the cgroup and cgroup2 mounts of this mount namespace.
func readMounts() ([]mount, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	var out []mount
	for line := range strings.SplitSeq(string(data), "\n") {
		// id parent maj:min root point opts [optional...] - fstype source superopts
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 6 || len(f) < sep+4 {
			continue
		}
		if t := f[sep+1]; t == "cgroup" || t == "cgroup2" {
			out = append(out, mount{
				point:  unescape(f[4]),
				root:   unescape(f[3]),
				fstype: t,
				opts:   strings.Split(f[sep+3], ","),
			})
		}
	}
	return out, nil
}

// findMount returns the first mount of fstype whose options hold opt (any
// mount when opt is "").
func findMount(mounts []mount, fstype, opt string) (mount, bool) {
	for _, m := range mounts {
		if m.fstype == fstype && (opt == "" || slices.Contains(m.opts, opt)) {
			return m, true
		}
	}
	return mount{}, false
}

// unescape undoes mountinfo's octal escapes (\040 for a space, ...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func exists(path string) bool {
	var st unix.Stat_t
	return unix.Stat(path, &st) == nil
}

// mkdir makes dir, and its parents if they are missing; created is false
// when dir was there already.
func mkdir(dir string) (created bool, err error) {
	err = unix.Mkdir(dir, 0o755)
	if errors.Is(err, unix.ENOENT) {
		if err = os.MkdirAll(filepath.Dir(dir), 0o755); err == nil {
			err = unix.Mkdir(dir, 0o755)
		}
	}
	if errors.Is(err, unix.EEXIST) {
		return false, nil
	}
	return err == nil, err
}

// writeFile writes val to a cgroup file with one write(2), as cgroupfs
// wants. It uses raw syscalls: os.OpenFile adds a poller registration and
// an fstat that are a measurable part of a Create.
func writeFile(path, val string) error {
	fd, err := ignoringEINTR(func() (int, error) {
		return unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if _, err := ignoringEINTR(func() (int, error) { return unix.Write(fd, []byte(val)) }); err != nil {
		return &os.PathError{Op: "write " + strconv.Quote(val), Path: path, Err: err}
	}
	return nil
}

// readFile reads a whole cgroup file.
func readFile(path string) ([]byte, error) {
	fd, err := ignoringEINTR(func() (int, error) {
		return unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, 512)
	for {
		n, err := ignoringEINTR(func() (int, error) { return unix.Read(fd, buf[len(buf):cap(buf)]) })
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, cap(buf))
		}
	}
}

func ignoringEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

// readInt reads a file holding one integer; "max" reads as 0 (unlimited).
func readInt(path string) (int64, error) {
	b, err := readFile(path)
	if err != nil {
		return 0, err
	}
	s := string(bytes.TrimSpace(b))
	if s == "max" {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroups: %s: %w", path, err)
	}
	return v, nil
}

// readKey reads the value of key from a flat-keyed file ("key value" lines,
// like memory.events or cpu.stat); a missing key reads as 0.
func readKey(path, key string) (int64, error) {
	b, err := readFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cgroups: %s: %s: %w", path, key, err)
			}
			return n, nil
		}
	}
	return 0, nil
}

// readPids parses dir/cgroup.procs.
func readPids(dir string) ([]int, error) {
	b, err := readFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for f := range bytes.FieldsSeq(b) {
		pid, err := strconv.Atoi(string(f))
		if err != nil {
			return nil, fmt.Errorf("cgroups: %s/cgroup.procs: %w", dir, err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// writeProcs moves process pid into dir. The kernel refuses (EINVAL) a
// task still being forked (TASK_NEW); like runc, retry a few times.
func writeProcs(dir string, pid int) error {
	path, val := filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid)
	var err error
	for range 5 {
		if err = writeFile(path, val); !errors.Is(err, unix.EINVAL) {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	return err
}

// poll calls done until it reports true, fails, or deadline passes, sleeping
// 50µs, 100µs, ... up to 10ms in between.
func poll(deadline time.Time, done func() (bool, error)) error {
	for wait := 50 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
		ok, err := done()
		if ok || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out: %w", errdefs.ErrDeadlineExceeded)
		}
		time.Sleep(wait)
	}
}

// wrap adds context to a file-system error and, where the errno says what
// happened, the matching errdefs sentinel. wrap(nil, ...) is nil.
func wrap(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	msg := fmt.Sprintf(format, args...)
	var sentinel error
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ESRCH):
		sentinel = errdefs.ErrNotFound
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM), errors.Is(err, unix.EROFS):
		sentinel = errdefs.ErrPermissionDenied
	}
	if sentinel == nil || errors.Is(err, sentinel) {
		return fmt.Errorf("%s: %w", msg, err)
	}
	return fmt.Errorf("%s: %w: %w", msg, err, sentinel)
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
