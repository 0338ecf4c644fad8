// Package tarfs moves directory trees in and out of tar streams, for the
// file archive endpoints (inside the sandbox, in the agent) and for `hutch
// cp` (on the client). Extraction goes through an os.Root, so no entry, and
// no symlink in an entry's way, can lead out of the target directory.
package tarfs

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

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Options say what crosses with the files.
type Options struct {
	// Owners keeps uids and gids (written into the tar, applied when
	// extracting); without it entries are written as 0:0 and extracted
	// as the extracting user's.
	Owners bool
}

// Write writes a tar of the directory root's contents (regular files,
// directories, symlinks; names relative to root) to w.
func Write(w io.Writer, root string, o Options) error {
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
		if !o.Owners {
			hdr.Uid, hdr.Gid = 0, 0
		}
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

// Extract extracts r into dir (which must exist).
func Extract(r io.Reader, dir string, o Options) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("extract into %s: %w", dir, err)
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
		if err := extractEntry(root, tr, hdr, o); err != nil {
			return err
		}
	}
}

func extractEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header, o Options) error {
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
		if o.Owners {
			_ = root.Lchown(name, hdr.Uid, hdr.Gid)
		}
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
	return fmt.Errorf("extract %s: %w", name, err)
}
