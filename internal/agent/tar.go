package agent

import (
	"archive/tar"
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
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// handleTarGet streams a tar of the directory at req.Path: regular files,
// directories, symlinks, with modes, owners and times.
func (s *Server) handleTarGet(c *proto.Conn, req *proto.Request) {
	root, err := s.resolve(req.Path)
	if err == nil {
		var fi fs.FileInfo
		if fi, err = os.Stat(root); err == nil && !fi.IsDir() {
			err = fmt.Errorf("archive %s: not a directory: %w", root, errdefs.ErrFailedPrecondition)
		}
		err = fileError("archive", root, err)
	}
	if err != nil {
		reply(c, proto.Response{}, err)
		return
	}
	if err := c.WriteJSON(proto.TResponse, proto.Response{}); err != nil {
		return
	}
	w := proto.DataWriter{C: c}
	if err := writeTar(w, root); err != nil {
		reply(c, proto.Response{}, fileError("archive", root, err))
		return
	}
	_ = w.Close()
}

func writeTar(w io.Writer, root string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return nil // vanished while walking
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			link, _ = os.Readlink(p)
		} else if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil // sockets, fifos, devices: not archived
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name, _ = filepath.Rel(root, p)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyN(tw, f, hdr.Size)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// handleTarPut extracts the client's tar into the directory at req.Path,
// through an os.Root so no entry (or symlink in its way) leaves it.
func (s *Server) handleTarPut(c *proto.Conn, req *proto.Request) {
	dir, err := s.resolve(req.Path)
	if err == nil {
		err = fileError("mkdir", dir, os.MkdirAll(dir, 0o755))
	}
	r := &proto.DataReader{C: c}
	if err == nil {
		err = extractTar(r, dir)
	}
	_, _ = io.Copy(io.Discard, r) // drain what is left of the stream
	reply(c, proto.Response{}, err)
}

func extractTar(r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fileError("extract", dir, err)
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if err := extractEntry(root, tr, hdr); err != nil {
			return err
		}
	}
}

func extractEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header) error {
	name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
	if name == "." || path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
		if name == "." {
			return nil
		}
		return fmt.Errorf("tar entry %q leaves the target directory: %w", hdr.Name, errdefs.ErrInvalidArgument)
	}
	if d := path.Dir(name); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return entryError(hdr.Name, err)
		}
	}
	mode := fs.FileMode(hdr.Mode).Perm() | fs.FileMode(hdr.Mode)&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
	var err error
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err = root.MkdirAll(name, 0o755); err == nil {
			err = root.Chmod(name, fs.FileMode(hdr.Mode).Perm())
		}
	case tar.TypeReg:
		err = writeEntry(root, name, mode, tr)
	case tar.TypeSymlink:
		_ = root.Remove(name)
		err = root.Symlink(hdr.Linkname, name)
	case tar.TypeLink:
		_ = root.Remove(name)
		err = root.Link(path.Clean(hdr.Linkname), name)
	default:
		return nil // devices, fifos: skipped
	}
	if err != nil {
		return entryError(hdr.Name, err)
	}
	if hdr.Typeflag != tar.TypeSymlink {
		_ = root.Lchown(name, hdr.Uid, hdr.Gid)
		_ = root.Chtimes(name, hdr.ModTime, hdr.ModTime)
	}
	return nil
}

func writeEntry(root *os.Root, name string, mode fs.FileMode, r io.Reader) error {
	_ = root.Remove(name)
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Chmod(name, mode)
	}
	return err
}

func entryError(name string, err error) error {
	// os.Root refuses a path that escapes it with an error that is no
	// errno (its sentinel is unexported); every kernel failure is an errno.
	var pe *fs.PathError
	var errno syscall.Errno
	if errors.As(err, &pe) && !errors.As(err, &errno) {
		return fmt.Errorf("tar entry %q leads out of the target directory: %v: %w", name, err, errdefs.ErrInvalidArgument)
	}
	return fileError("extract", name, err)
}
