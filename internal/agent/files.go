package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/hutch-dev/hutch/internal/agent/proto"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// maxList bounds one listing; a larger tree needs a glob or a smaller depth.
const maxList = 10000

// fileError gives an OS error its errdefs class.
func fileError(op, p string, err error) error {
	var class error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		class = errdefs.ErrNotFound
	case errors.Is(err, fs.ErrExist):
		class = errdefs.ErrAlreadyExists
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		class = errdefs.ErrPermissionDenied
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY):
		class = errdefs.ErrFailedPrecondition
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		class = errdefs.ErrResourceExhausted
	case errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ELOOP):
		class = errdefs.ErrInvalidArgument
	default:
		return fmt.Errorf("%s %s: %w", op, p, err)
	}
	return fmt.Errorf("%s %s: %v: %w", op, p, unwrapSyscall(err), class)
}

func unwrapSyscall(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}

func reply(c *proto.Conn, r proto.Response, err error) {
	if err != nil {
		r = proto.Response{Error: proto.ToWire(err)}
	}
	_ = c.WriteJSON(proto.TResponse, r)
}

func statInfo(p string, fi fs.FileInfo) backend.FileInfo {
	info := backend.FileInfo{Name: fi.Name(), Path: p, Size: fi.Size(), Mode: fi.Mode(),
		ModTime: fi.ModTime(), IsDir: fi.IsDir()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.UID, info.GID = int(st.Uid), int(st.Gid)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		info.Link, _ = os.Readlink(p)
	}
	return info
}

func (s *Server) handleRead(c *proto.Conn, req *proto.Request) {
	p, err := s.resolve(req.Path)
	if err != nil {
		reply(c, proto.Response{}, err)
		return
	}
	f, err := os.Open(p)
	if err != nil {
		reply(c, proto.Response{}, fileError("read", p, err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err == nil && fi.IsDir() {
		err = fmt.Errorf("read %s: is a directory: %w", p, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		reply(c, proto.Response{}, err)
		return
	}
	info := statInfo(p, fi)
	if err := c.WriteJSON(proto.TResponse, proto.Response{Info: &info}); err != nil {
		return
	}
	w := proto.DataWriter{C: c}
	if _, err := io.Copy(w, f); err != nil {
		reply(c, proto.Response{}, fileError("read", p, err))
		return
	}
	_ = w.Close()
}

// handleWrite writes the client's data to a temporary file beside the
// target and renames it into place, so a reader never sees half a file.
func (s *Server) handleWrite(c *proto.Conn, req *proto.Request) {
	p, err := s.resolve(req.Path)
	if err == nil {
		err = s.writeFile(p, fs.FileMode(req.Mode), &proto.DataReader{C: c})
	}
	var r proto.Response
	if err == nil {
		if fi, serr := os.Lstat(p); serr == nil {
			info := statInfo(p, fi)
			r.Info = &info
		}
	}
	reply(c, r, err)
}

func (s *Server) writeFile(p string, mode fs.FileMode, r io.Reader) error {
	if mode == 0 {
		mode = 0o644
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return fmt.Errorf("write %s: is a directory: %w", p, errdefs.ErrFailedPrecondition)
	}
	dir := path.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fileError("mkdir", dir, err)
	}
	tmp, err := os.CreateTemp(dir, ".hutch-write-*")
	if err != nil {
		return fileError("write", p, err)
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, r)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), mode.Perm()|mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	return fileError("write", p, err)
}

func (s *Server) handleFileOp(c *proto.Conn, req *proto.Request) {
	p, err := s.resolve(req.Path)
	if err != nil {
		reply(c, proto.Response{}, err)
		return
	}
	var r proto.Response
	switch req.Op {
	case proto.OpStat:
		var fi fs.FileInfo
		if fi, err = os.Lstat(p); err == nil {
			info := statInfo(p, fi)
			r.Info = &info
		}
		err = fileError("stat", p, err)
	case proto.OpList:
		r.Files, err = s.listDir(p, req.List)
	case proto.OpMkdir:
		err = fileError("mkdir", p, os.MkdirAll(p, orMode(req.Mode, 0o755)))
	case proto.OpRemove:
		err = remove(p, req.Recursive)
	case proto.OpRename:
		var to string
		if to, err = s.resolve(req.To); err == nil {
			err = fileError("rename", p, os.Rename(p, to))
		}
	default:
		err = fmt.Errorf("unknown op %q: %w", req.Op, errdefs.ErrInvalidArgument)
	}
	reply(c, r, err)
}

func orMode(m uint32, d fs.FileMode) fs.FileMode {
	if m == 0 {
		return d
	}
	return fs.FileMode(m).Perm()
}

func remove(p string, recursive bool) error {
	if p == "/" {
		return fmt.Errorf("remove /: %w", errdefs.ErrPermissionDenied)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return fileError("remove", p, err)
	}
	if fi.IsDir() && !recursive {
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("remove %s: directory is not empty and recursive is not set: %w", p, errdefs.ErrFailedPrecondition)
		}
		return nil
	}
	return fileError("remove", p, os.RemoveAll(p))
}

// listDir lists p down to opts.Depth levels (1 when unset), keeping the
// entries whose path relative to p matches opts.Glob.
func (s *Server) listDir(root string, opts backend.ListOptions) ([]backend.FileInfo, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fileError("list", root, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("list %s: not a directory: %w", root, errdefs.ErrFailedPrecondition)
	}
	if opts.Glob != "" {
		if _, err := path.Match(opts.Glob, ""); err != nil {
			return nil, fmt.Errorf("glob %q: %w", opts.Glob, errdefs.ErrInvalidArgument)
		}
	}
	depth := max(opts.Depth, 1)
	out := []backend.FileInfo{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if p == root {
			return err
		}
		if err != nil {
			return nil // unreadable entries are skipped, not fatal
		}
		rel := strings.TrimPrefix(p, strings.TrimSuffix(root, "/")+"/")
		if d.IsDir() && strings.Count(rel, "/")+1 >= depth {
			if keep(rel, opts.Glob) {
				if err := addInfo(&out, p, d); err != nil {
					return err
				}
			}
			return fs.SkipDir
		}
		if keep(rel, opts.Glob) {
			return addInfo(&out, p, d)
		}
		return nil
	})
	if err != nil {
		return nil, fileError("list", root, err)
	}
	return out, nil
}

// keep reports whether rel matches glob: the whole relative path, or its
// last element for a pattern without a slash. A "**" element matches any
// number of directories (none included), so "**/*.ts" keeps a.ts and
// src/lib/b.ts.
func keep(rel, glob string) bool {
	if glob == "" {
		return true
	}
	if matchPath(strings.Split(glob, "/"), strings.Split(rel, "/")) {
		return true
	}
	ok, _ := path.Match(glob, path.Base(rel))
	return ok
}

// matchPath matches path elements against pattern elements, each with
// path.Match, "**" standing for zero or more elements.
func matchPath(pat, elems []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for len(pat) > 1 && pat[1] == "**" {
				pat = pat[1:]
			}
			if len(pat) == 1 {
				return true
			}
			for i := range elems {
				if matchPath(pat[1:], elems[i:]) {
					return true
				}
			}
			return false
		}
		if len(elems) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], elems[0]); !ok {
			return false
		}
		pat, elems = pat[1:], elems[1:]
	}
	return len(elems) == 0
}

func addInfo(out *[]backend.FileInfo, p string, d fs.DirEntry) error {
	if len(*out) >= maxList {
		return fmt.Errorf("more than %d entries; narrow the listing with a glob or a smaller depth: %w", maxList, errdefs.ErrResourceExhausted)
	}
	fi, err := d.Info()
	if err != nil {
		return nil
	}
	*out = append(*out, statInfo(p, fi))
	return nil
}
