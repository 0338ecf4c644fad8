package cli

import (
	"archive/tar"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// writeTar writes a tar of the directory root's contents (regular files,
// directories and symlinks; names relative to root) to w.
func writeTar(w io.Writer, root string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return addEntry(tw, root, p, fi)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func addEntry(tw *tar.Writer, root, p string, fi fs.FileInfo) error {
	link := ""
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		var err error
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	case !fi.Mode().IsRegular() && !fi.IsDir():
		return nil // sockets, fifos, devices: not copied
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	rel, _ := filepath.Rel(root, p)
	hdr.Name = filepath.ToSlash(rel)
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
	if err := tw.WriteHeader(hdr); err != nil || !fi.Mode().IsRegular() {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.CopyN(tw, f, hdr.Size)
	return err
}

// extractTar extracts r into dir (created if missing) through an os.Root,
// so that no entry, nor a symlink in its way, leaves dir.
func extractTar(r io.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := extractEntry(root, tr, hdr); err != nil {
			return err
		}
	}
}

func extractEntry(root *os.Root, r io.Reader, hdr *tar.Header) error {
	name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
	if name == "." {
		return nil
	}
	if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
		return errdefs.New(errdefs.ErrInvalidArgument, "tar entry %q leaves the target directory", hdr.Name)
	}
	if d := path.Dir(name); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	perm := fs.FileMode(hdr.Mode).Perm()
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.MkdirAll(name, 0o755); err != nil {
			return err
		}
		return root.Chmod(name, perm)
	case tar.TypeReg:
		f, err := root.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = root.Chmod(name, perm)
		}
		return err
	case tar.TypeSymlink:
		_ = root.Remove(name)
		return root.Symlink(hdr.Linkname, name)
	}
	return nil // hard links, devices, fifos: not copied
}
