// Package imagefs turns an OCI image into the plain directory tree that a
// sandbox's overlayfs uses as its read-only lower layer.
//
// Images arrive as files — a `docker save` tarball or an OCI image layout
// directory — never from a registry, so hutch can run images without a
// container engine. The layers are applied in order with OCI whiteouts, so
// the tree is what a container runtime would show. Unpacking runs as root
// and image content is untrusted, so every write is confined to the
// destination: paths are resolved with openat2(RESOLVE_BENEATH) and never
// through a symlink that leaves it (see fsutil.go). Cache keeps one unpacked
// tree per image config digest so sandboxes of the same image share it.
package imagefs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Image describes an unpacked image, from its config.
type Image struct {
	// Digest is the config digest ("sha256:..."): a stable id for the
	// image's content, since the config lists the layers' diff ids.
	Digest     string   `json:"digest"`
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	User       string   `json:"user,omitempty"`
}

// Unpack writes the flattened root filesystem of an image into dst, which
// must not exist yet (errdefs.ErrAlreadyExists); its parent must.
//
// src is a `docker save` tarball or an OCI image layout directory. ref picks
// one image from it by tag ("busybox:latest") or digest (config digest, or
// manifest digest in a layout); an empty ref takes the only image and is
// errdefs.ErrInvalidArgument when there are several. A missing src is
// errdefs.ErrNotFound, a ref that matches nothing too.
//
// Regular files, directories, symlinks, hard links and fifos are created
// with their uid/gid, mode (setuid, setgid and sticky included) and mtime;
// character and block devices are skipped. A malformed image or an entry
// that would write outside dst fails with errdefs.ErrInvalidArgument. On
// any failure dst is removed. Unpack must run as root.
func Unpack(ctx context.Context, src, ref, dst string) (Image, error) {
	img, meta, err := open(src, ref)
	if err != nil {
		return Image{}, err
	}
	if err := unpackInto(ctx, img, dst); err != nil {
		return Image{}, err
	}
	return meta, nil
}

// unpackInto creates dst and extracts img into it, removing dst on failure.
func unpackInto(ctx context.Context, img v1.Image, dst string) error {
	if err := os.Mkdir(dst, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("imagefs: destination %s: %w", dst, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("imagefs: create destination: %w", err)
	}
	err := os.Chmod(dst, 0o755) // not the umask's; a "./" entry may change it
	if err == nil {
		err = extract(ctx, img, dst)
	}
	if err != nil {
		if rerr := os.RemoveAll(dst); rerr != nil {
			return fmt.Errorf("%w (and removing %s: %v)", err, dst, rerr)
		}
		return err
	}
	return nil
}

// open finds the image ref names in src and reads its config.
func open(src, ref string) (v1.Image, Image, error) {
	fi, err := os.Stat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Image{}, fmt.Errorf("imagefs: image source %s: %w", src, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, Image{}, fmt.Errorf("imagefs: image source: %w", err)
	}
	var img v1.Image
	if fi.IsDir() {
		img, err = openLayout(src, ref)
	} else {
		img, err = openTarball(src, ref)
	}
	if err != nil {
		return nil, Image{}, err
	}
	meta, err := describe(img)
	if err != nil {
		return nil, Image{}, fmt.Errorf("imagefs: %s: %w", src, err)
	}
	return img, meta, nil
}

// describe reads the parts of the image config that Image carries.
func describe(img v1.Image) (Image, error) {
	h, err := img.ConfigName()
	if err != nil {
		return Image{}, malformed("config digest", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Image{}, malformed("config", err)
	}
	c := cf.Config
	return Image{
		Digest:     h.String(),
		Env:        c.Env,
		WorkingDir: c.WorkingDir,
		Entrypoint: c.Entrypoint,
		Cmd:        c.Cmd,
		User:       c.User,
	}, nil
}

// malformed wraps an error from reading the image as ErrInvalidArgument.
func malformed(what string, err error) error {
	return fmt.Errorf("malformed image: %s: %v: %w", what, err, errdefs.ErrInvalidArgument)
}
