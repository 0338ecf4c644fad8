package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unsafe"

	"github.com/hutch-dev/hutch/internal/agent/proto"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// watchMask is what a watch reports. IN_MOVED_TO counts as a create and
// IN_MOVED_FROM as a rename of the old name, as fsnotify does.
const watchMask = syscall.IN_CREATE | syscall.IN_MODIFY | syscall.IN_DELETE | syscall.IN_MOVED_FROM |
	syscall.IN_MOVED_TO | syscall.IN_ATTRIB | syscall.IN_DELETE_SELF | syscall.IN_ONLYDIR

// maxWatches bounds the directories one recursive watch adds.
const maxWatches = 8192

// inotify is one watch: the inotify file (non-blocking, so the runtime's
// poller can interrupt a Read by Close) and its watch descriptors.
type inotify struct {
	f         *os.File
	dirs      map[int32]string
	recursive bool
	// writes are the rename cookies of the agent's own atomic writes in
	// flight (see writeTemp).
	writes map[uint32]bool
}

// writeTemp prefixes the temporary files writeFile renames into place.
// Their own events are hidden; the rename into place is reported as a
// create and a write of the target, which is what a client watching for
// its file expects (an in-place write would give those too).
const writeTemp = ".hutch-write-"

func newInotify(recursive bool) (*inotify, error) {
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		return nil, fileError("inotify", "", err)
	}
	return &inotify{f: os.NewFile(uintptr(fd), "inotify"), dirs: map[int32]string{}, recursive: recursive, writes: map[uint32]bool{}}, nil
}

// add watches dir, and with recursive every directory beneath it.
func (in *inotify) add(dir string) error {
	if !in.recursive {
		return in.addOne(dir)
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // a directory that vanished or cannot be read
		}
		if !d.IsDir() {
			return nil
		}
		if err := in.addOne(p); err != nil && p == dir {
			return err
		}
		return nil
	})
}

func (in *inotify) addOne(dir string) error {
	if len(in.dirs) >= maxWatches {
		return fmt.Errorf("watch %s: more than %d directories: %w", dir, maxWatches, errdefs.ErrResourceExhausted)
	}
	sc, err := in.f.SyscallConn()
	if err != nil {
		return err
	}
	var wd int
	var werr error
	if err := sc.Control(func(fd uintptr) { wd, werr = syscall.InotifyAddWatch(int(fd), dir, watchMask) }); err != nil {
		return err
	}
	if werr != nil {
		return fileError("watch", dir, werr)
	}
	in.dirs[int32(wd)] = dir
	return nil
}

// events parses one read's worth of inotify records into watch events,
// adding watches for new directories when recursive.
func (in *inotify) events(buf []byte) []backend.WatchEvent {
	var out []backend.WatchEvent
	for len(buf) >= syscall.SizeofInotifyEvent {
		ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[0]))
		end := syscall.SizeofInotifyEvent + int(ev.Len)
		if end > len(buf) {
			break
		}
		name := string(buf[syscall.SizeofInotifyEvent:end])
		for len(name) > 0 && name[len(name)-1] == 0 {
			name = name[:len(name)-1]
		}
		buf = buf[end:]
		dir, ok := in.dirs[ev.Wd]
		if !ok {
			continue
		}
		if ev.Mask&syscall.IN_IGNORED != 0 {
			delete(in.dirs, ev.Wd)
			continue
		}
		p := dir
		if name != "" {
			p = filepath.Join(dir, name)
		}
		if strings.HasPrefix(name, writeTemp) {
			if ev.Mask&syscall.IN_MOVED_FROM != 0 && len(in.writes) < 1024 {
				in.writes[ev.Cookie] = true
			}
			continue
		}
		if ev.Mask&syscall.IN_MOVED_TO != 0 && in.writes[ev.Cookie] {
			delete(in.writes, ev.Cookie)
			out = append(out, backend.WatchEvent{Path: p, Op: backend.WatchCreate}, backend.WatchEvent{Path: p, Op: backend.WatchWrite})
			continue
		}
		if in.recursive && ev.Mask&syscall.IN_ISDIR != 0 && ev.Mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0 {
			_ = in.add(p)
		}
		if op := opOf(ev.Mask); op != "" {
			out = append(out, backend.WatchEvent{Path: p, Op: op})
		}
	}
	return out
}

func opOf(mask uint32) backend.WatchOp {
	switch {
	case mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0:
		return backend.WatchCreate
	case mask&syscall.IN_MODIFY != 0:
		return backend.WatchWrite
	case mask&(syscall.IN_DELETE|syscall.IN_DELETE_SELF) != 0:
		return backend.WatchRemove
	case mask&syscall.IN_MOVED_FROM != 0:
		return backend.WatchRename
	case mask&syscall.IN_ATTRIB != 0:
		return backend.WatchChmod
	}
	return ""
}

// handleWatch answers whether the watch is set, then streams its events
// until the client closes the connection (or the watched directory goes).
func (s *Server) handleWatch(c *proto.Conn, req *proto.Request) {
	p, err := s.resolve(req.Path)
	if err != nil {
		reply(c, proto.Response{}, err)
		return
	}
	fi, err := os.Stat(p)
	if err == nil && !fi.IsDir() {
		err = fmt.Errorf("watch %s: not a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		reply(c, proto.Response{}, fileError("watch", p, err))
		return
	}
	in, err := newInotify(req.Recursive)
	if err != nil {
		reply(c, proto.Response{}, err)
		return
	}
	defer in.f.Close()
	if err := in.add(p); err != nil {
		reply(c, proto.Response{}, err)
		return
	}
	reply(c, proto.Response{}, nil)
	// The client sends nothing more; its read ends when it hangs up, and
	// closing the inotify file then ends the loop below.
	go func() {
		for {
			if _, _, err := c.ReadFrame(); err != nil {
				in.f.Close()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for len(in.dirs) > 0 {
		n, err := in.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				_ = c.WriteJSON(proto.TResponse, proto.Response{Error: proto.ToWire(err)})
			}
			return
		}
		for _, ev := range in.events(buf[:n]) {
			if err := c.WriteJSON(proto.TWatch, ev); err != nil {
				return
			}
		}
	}
}

// Watch starts a watch of dir inside the sandbox. Its events arrive until
// the stream is closed or ctx ends.
func (cl *Client) Watch(ctx context.Context, dir string, recursive bool) (backend.WatchStream, error) {
	c, stop, err := cl.openStream(ctx, proto.Request{Op: proto.OpWatch, Path: dir, Recursive: recursive})
	if err != nil {
		return nil, err
	}
	return &watchStream{c: c, ctx: ctx, stop: stop}, nil
}

type watchStream struct {
	c    *proto.Conn
	ctx  context.Context
	stop func() bool
}

func (w *watchStream) Next() (backend.WatchEvent, error) {
	t, p, err := w.c.ReadFrame()
	if err != nil {
		return backend.WatchEvent{}, connError(w.ctx, err)
	}
	switch t {
	case proto.TWatch:
		var ev backend.WatchEvent
		err := json.Unmarshal(p, &ev)
		return ev, err
	case proto.TResponse:
		var r proto.Response
		if err := json.Unmarshal(p, &r); err != nil {
			return backend.WatchEvent{}, err
		}
		if err := r.Error.Err(); err != nil {
			return backend.WatchEvent{}, err
		}
		return backend.WatchEvent{}, io.EOF
	}
	return backend.WatchEvent{}, fmt.Errorf("protocol: unexpected frame %q in a watch", t)
}

func (w *watchStream) Close() error {
	w.stop()
	return w.c.Close()
}
