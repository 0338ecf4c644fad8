package imagefs

import (
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Annotations that name an image in an OCI layout's index.json. containerd
// and docker (25+) write the full reference in the first; the second holds
// either a full reference or just a tag, depending on the tool.
const (
	annotContainerdName = "io.containerd.image.name"
	annotRefName        = "org.opencontainers.image.ref.name"
)

// openTarball picks ref's image from a `docker save` tarball.
func openTarball(src, ref string) (v1.Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(src) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("imagefs: %s is not a docker-save tarball: %v: %w", src, err, errdefs.ErrInvalidArgument)
	}
	d, err := pickTarball(m, ref)
	if err != nil {
		return nil, fmt.Errorf("imagefs: %s: %w", src, err)
	}
	// tarball.Image selects by tag only; a nil tag means "the only image".
	var tag *name.Tag
	if len(m) > 1 {
		if len(d.RepoTags) == 0 {
			return nil, fmt.Errorf("imagefs: %s: untagged image %s in a multi-image tarball cannot be selected: %w",
				src, tarConfigDigest(d.Config), errdefs.ErrInvalidArgument)
		}
		t, err := name.NewTag(d.RepoTags[0])
		if err != nil {
			return nil, malformed("repo tag", err)
		}
		tag = &t
	}
	img, err := tarball.Image(opener, tag)
	if err != nil {
		return nil, fmt.Errorf("imagefs: %s: %w", src, malformed("tarball", err))
	}
	return img, nil
}

// pickTarball finds the manifest.json entry that ref names.
func pickTarball(m tarball.Manifest, ref string) (*tarball.Descriptor, error) {
	names := make([]string, len(m))
	for i, d := range m {
		names[i] = tarConfigDigest(d.Config)
		if len(d.RepoTags) > 0 {
			names[i] = strings.Join(d.RepoTags, ", ")
		}
	}
	if ref == "" {
		return only(len(m), names, func(i int) *tarball.Descriptor { return &m[i] })
	}
	want, isDigest := refDigest(ref)
	for i, d := range m {
		if isDigest && tarConfigDigest(d.Config) == want {
			return &m[i], nil
		}
		for _, t := range d.RepoTags {
			if sameRef(ref, t) {
				return &m[i], nil
			}
		}
	}
	return nil, notFound(ref, names)
}

// tarConfigDigest derives the config digest from a manifest.json Config
// path: "sha256:<hex>" (go-containerregistry), "<hex>.json" (docker before
// 25) or "blobs/sha256/<hex>" (docker 25+).
func tarConfigDigest(p string) string {
	b := strings.TrimSuffix(path.Base(p), ".json")
	return "sha256:" + strings.TrimPrefix(b, "sha256:")
}

// openLayout picks ref's image from an OCI image layout directory.
func openLayout(src, ref string) (v1.Image, error) {
	if _, err := os.Stat(filepath.Join(src, "oci-layout")); err != nil {
		return nil, fmt.Errorf("imagefs: %s is a directory but not an OCI image layout: %w", src, errdefs.ErrInvalidArgument)
	}
	idx, err := layout.ImageIndexFromPath(src)
	if err != nil {
		return nil, fmt.Errorf("imagefs: %s: %w", src, malformed("index.json", err))
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("imagefs: %s: %w", src, malformed("index.json", err))
	}
	var cands []v1.Descriptor
	for _, d := range im.Manifests {
		if d.MediaType.IsImage() || d.MediaType.IsIndex() {
			cands = append(cands, d)
		}
	}
	img, err := pickLayout(idx, cands, ref)
	if err != nil {
		return nil, fmt.Errorf("imagefs: %s: %w", src, err)
	}
	return img, nil
}

// pickLayout resolves ref against the layout's top-level descriptors.
func pickLayout(idx v1.ImageIndex, cands []v1.Descriptor, ref string) (v1.Image, error) {
	names := make([]string, len(cands))
	for i, d := range cands {
		names[i] = layoutName(d)
	}
	if ref == "" {
		d, err := only(len(cands), names, func(i int) *v1.Descriptor { return &cands[i] })
		if err != nil {
			return nil, err
		}
		return imageFor(idx, *d, 0)
	}
	want, isDigest := refDigest(ref)
	for _, d := range cands {
		if (isDigest && d.Digest.String() == want) || matchesAnnotations(ref, d) {
			return imageFor(idx, d, 0)
		}
	}
	if isDigest { // maybe a config digest
		for _, d := range cands {
			img, err := imageFor(idx, d, 0)
			if err != nil {
				continue
			}
			if h, err := img.ConfigName(); err == nil && h.String() == want {
				return img, nil
			}
		}
	}
	return nil, notFound(ref, names)
}

func layoutName(d v1.Descriptor) string {
	for _, k := range []string{annotContainerdName, annotRefName} {
		if n := d.Annotations[k]; n != "" {
			return n
		}
	}
	return d.Digest.String()
}

func matchesAnnotations(ref string, d v1.Descriptor) bool {
	for _, k := range []string{annotContainerdName, annotRefName} {
		if n := d.Annotations[k]; n != "" && sameRef(ref, n) {
			return true
		}
	}
	return false
}

// imageFor returns the image d describes; an index (a multi-platform
// image) resolves to its linux/GOARCH manifest.
func imageFor(idx v1.ImageIndex, d v1.Descriptor, depth int) (v1.Image, error) {
	switch {
	case d.MediaType.IsImage():
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, malformed("manifest "+d.Digest.String(), err)
		}
		return img, nil
	case d.MediaType.IsIndex() && depth < 4:
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, malformed("index "+d.Digest.String(), err)
		}
		im, err := child.IndexManifest()
		if err != nil {
			return nil, malformed("index "+d.Digest.String(), err)
		}
		pd, ok := pickPlatform(im.Manifests)
		if !ok {
			return nil, fmt.Errorf("image %s has no linux/%s variant: %w", d.Digest, runtime.GOARCH, errdefs.ErrInvalidArgument)
		}
		return imageFor(child, pd, depth+1)
	}
	return nil, fmt.Errorf("descriptor %s has unsupported media type %q: %w", d.Digest, d.MediaType, errdefs.ErrInvalidArgument)
}

// pickPlatform chooses the linux/GOARCH entry of an image index, or its
// only image entry when none names a platform.
func pickPlatform(ms []v1.Descriptor) (v1.Descriptor, bool) {
	var bare []v1.Descriptor
	for _, m := range ms {
		p := m.Platform
		if p == nil {
			if m.MediaType.IsImage() {
				bare = append(bare, m)
			}
			continue
		}
		if p.OS == "linux" && p.Architecture == runtime.GOARCH {
			return m, true
		}
	}
	if len(bare) == 1 {
		return bare[0], true
	}
	return v1.Descriptor{}, false
}

// only returns the single candidate when ref is empty.
func only[T any](n int, names []string, at func(int) *T) (*T, error) {
	switch n {
	case 1:
		return at(0), nil
	case 0:
		return nil, fmt.Errorf("no image found: %w", errdefs.ErrInvalidArgument)
	}
	return nil, fmt.Errorf("%d images found, name one of [%s]: %w", n, strings.Join(names, "; "), errdefs.ErrInvalidArgument)
}

func notFound(ref string, names []string) error {
	return fmt.Errorf("image %q not found among [%s]: %w", ref, strings.Join(names, "; "), errdefs.ErrNotFound)
}

// refDigest reports whether ref names a digest ("sha256:<hex>",
// "name@sha256:<hex>" or a bare 64-digit hex image id) and returns it as
// "sha256:<hex>".
func refDigest(ref string) (string, bool) {
	if i := strings.LastIndex(ref, "@"); i >= 0 {
		ref = ref[i+1:]
	}
	if len(ref) == 64 && !strings.Contains(ref, ":") {
		ref = "sha256:" + ref
	}
	h, err := v1.NewHash(ref)
	if err != nil {
		return "", false
	}
	return h.String(), true
}

// sameRef compares two image references the way docker does: "busybox",
// "busybox:latest" and "docker.io/library/busybox:latest" are one tag.
func sameRef(a, b string) bool {
	if a == b {
		return true
	}
	ta, err := name.NewTag(a)
	if err != nil {
		return false
	}
	tb, err := name.NewTag(b)
	return err == nil && ta.Name() == tb.Name()
}
