package native_test

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ociTarball packs a root filesystem directory as a one-layer image in a
// `docker save` tarball, the way a user would bring an image here.
func ociTarball(t *testing.T, rootfs string) (string, error) {
	layerTar, err := tarDir(rootfs)
	if err != nil {
		return "", err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return "", err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return "", err
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin", "FROM_IMAGE=1"}, WorkingDir: "/workspace"})
	if err != nil {
		return "", err
	}
	tag, err := name.NewTag("hutch-test/busybox:latest")
	if err != nil {
		return "", err
	}
	out := filepath.Join(traversableTempDir(t), "busybox.tar")
	return out, tarball.WriteToFile(out, tag, img)
}

func tarDir(root string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			link, _ = os.Readlink(p)
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name, _ = filepath.Rel(root, p)
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(data)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return buf.Bytes(), tw.Close()
}
