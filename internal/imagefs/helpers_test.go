package imagefs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Test images are built here from in-memory tar layers: no registry, no
// docker engine.

var epoch = time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)

// ent is one tar entry of a test layer.
type ent struct {
	hdr  tar.Header
	body string
}

func file(name, body string, mode int64, uid int) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Uid: uid, Gid: uid, Size: int64(len(body))}, body: body}
}

func dir(name string, mode int64, uid int) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: uid}}
}

func symlink(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

func hardlink(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o755}}
}

func whiteout(name string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name}}
}

func special(name string, typ byte, mode int64) ent {
	return ent{hdr: tar.Header{Typeflag: typ, Name: name, Mode: mode, Devmajor: 1, Devminor: 3}}
}

// layer builds an uncompressed tar layer from entries.
func layer(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := e.hdr
		if h.ModTime.IsZero() {
			h.ModTime = epoch
		}
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %q: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// image stacks layers on an empty image and sets its config.
func image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// writeTarball writes images as one `docker save` tarball; keys are tags.
func writeTarball(t testing.TB, imgs map[string]v1.Image) string {
	t.Helper()
	refs := map[name.Reference]v1.Image{}
	for tag, img := range imgs {
		ref, err := name.NewTag(tag)
		if err != nil {
			t.Fatal(err)
		}
		refs[ref] = img
	}
	p := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.MultiRefWriteToFile(p, refs); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeLayout writes images as an OCI layout; keys are ref.name annotations.
func writeLayout(t testing.TB, imgs map[string]v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for ref, img := range imgs {
		ann := map[string]string{annotRefName: ref}
		if err := p.AppendImage(img, layout.WithAnnotations(ann)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func configDigest(t testing.TB, img v1.Image) string {
	t.Helper()
	h, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("unpacking sets file ownership: run as root")
	}
}

func lstat(t testing.TB, p string) os.FileInfo {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func assertMissing(t testing.TB, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("%s: want it absent, Lstat err=%v", p, err)
	}
}
