package native

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// rootfs is a resolved base: the lower layer directory plus host trees
// bind-mounted read-only into it (the host base's /usr and friends).
type rootfs struct {
	Lower string   `json:"lower"`
	Binds []bind   `json:"binds,omitempty"`
	Env   []string `json:"env,omitempty"` // from an image config
	Cwd   string   `json:"cwd,omitempty"`
}

type bind struct {
	Source string `json:"source"` // host path
	Target string `json:"target"` // path inside the sandbox
}

// hostSystemDirs are the host trees the host base shows, read-only. A
// symlink among them (merged /usr) is copied as a symlink instead.
var hostSystemDirs = []string{"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// hostEtc is what the host base copies from the host's /etc: public system
// configuration only, never credentials, keys or user data.
var hostEtc = []string{
	"os-release", "protocols", "services", "shells", "profile", "bash.bashrc",
	"inputrc", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives",
	"ssl/certs", "ssl/openssl.cnf", "ca-certificates.conf", "localtime", "timezone",
	"mime.types", "gai.conf", "host.conf", "debian_version", "issue", "magic",
	"mke2fs.conf", "xattr.conf", "networks", "rpc",
}

// resolveBase turns a Spec's base name into a rootfs.
func (b *Backend) resolveBase(ctx context.Context, name string) (rootfs, error) {
	kind, arg, _ := strings.Cut(name, ":")
	switch kind {
	case "", "host":
		if arg != "" {
			return rootfs{}, fmt.Errorf("base %q: the host base takes no argument: %w", name, errdefs.ErrInvalidArgument)
		}
		return b.hostBase()
	case "dir":
		return dirBase(arg)
	case "oci":
		return b.ociBase(ctx, arg)
	}
	return rootfs{}, fmt.Errorf("base %q: want host, dir:/path or oci:/path[#ref]: %w", name, errdefs.ErrInvalidArgument)
}

func dirBase(dir string) (rootfs, error) {
	if !filepath.IsAbs(dir) {
		return rootfs{}, fmt.Errorf("dir base %q: path must be absolute: %w", dir, errdefs.ErrInvalidArgument)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return rootfs{}, fmt.Errorf("dir base %s: %v: %w", dir, err, errdefs.ErrNotFound)
	}
	if !fi.IsDir() {
		return rootfs{}, fmt.Errorf("dir base %s is not a directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	return rootfs{Lower: filepath.Clean(dir)}, nil
}

func (b *Backend) ociBase(ctx context.Context, arg string) (rootfs, error) {
	src, ref, _ := strings.Cut(arg, "#")
	if !filepath.IsAbs(src) {
		return rootfs{}, fmt.Errorf("oci base %q: path must be absolute: %w", src, errdefs.ErrInvalidArgument)
	}
	dir, img, err := b.images.Get(ctx, src, ref)
	if err != nil {
		return rootfs{}, err
	}
	return rootfs{Lower: dir, Env: img.Env, Cwd: img.WorkingDir}, nil
}

// hostBase returns the host base, building its skeleton once per content:
// the directory is named by a hash of what it holds, so a changed host
// makes a new generation and running sandboxes keep theirs.
func (b *Backend) hostBase() (rootfs, error) {
	b.hostOnce.Do(func() { b.host, b.hostErr = b.buildHostBase() })
	return b.host, b.hostErr
}

func (b *Backend) buildHostBase() (rootfs, error) {
	basesDir := filepath.Join(b.opts.DataDir, "bases")
	tmp, err := os.MkdirTemp(basesDir, ".host-")
	if err != nil {
		return rootfs{}, fmt.Errorf("host base: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return rootfs{}, err
	}
	binds, err := writeHostSkeleton(tmp)
	if err != nil {
		return rootfs{}, fmt.Errorf("host base: %w", err)
	}
	sum, err := treeHash(tmp)
	if err != nil {
		return rootfs{}, fmt.Errorf("host base: %w", err)
	}
	final := filepath.Join(basesDir, "host-"+sum[:16])
	if _, err := os.Stat(final); err != nil {
		if err := os.Rename(tmp, final); err != nil {
			return rootfs{}, fmt.Errorf("host base: %w", err)
		}
	}
	return rootfs{Lower: final, Binds: binds}, nil
}

func writeHostSkeleton(dir string) ([]bind, error) {
	var binds []bind
	for _, d := range hostSystemDirs {
		src := "/" + d
		fi, err := os.Lstat(src)
		switch {
		case err != nil:
			continue
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return nil, err
			}
			if err := os.Symlink(target, filepath.Join(dir, d)); err != nil {
				return nil, err
			}
		case fi.IsDir():
			if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
				return nil, err
			}
			binds = append(binds, bind{Source: src, Target: "/" + d})
		}
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp", "run", "var/tmp", "var/log", "var/cache",
		"var/lib", "home", "mnt", "opt", "srv", "media", "workspace", "etc/ssl"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{"tmp", "var/tmp"} {
		if err := os.Chmod(filepath.Join(dir, d), 0o1777); err != nil {
			return nil, err
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "root"), 0o700); err != nil {
		return nil, err
	}
	if err := writeSynthEtc(filepath.Join(dir, "etc")); err != nil {
		return nil, err
	}
	for _, name := range hostEtc {
		if err := copyTree(filepath.Join("/etc", name), filepath.Join(dir, "etc", name)); err != nil {
			return nil, err
		}
	}
	return binds, nil
}

func writeSynthEtc(etc string) error {
	shell := "/bin/sh"
	if _, err := os.Stat("/bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	files := map[string]string{
		"passwd":      "root:x:0:0:root:/root:" + shell + "\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"group":       "root:x:0:\ntty:x:5:\nstaff:x:50:\nusers:x:100:\nnogroup:x:65534:\n",
		"shadow":      "root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n",
		"hosts":       "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"resolv.conf": "# hutch: this sandbox's network policy sets the resolver\n",
		"nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n" +
			"networks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n",
		"hostname": "sandbox\n",
	}
	for name, content := range files {
		mode := fs.FileMode(0o644)
		if name == "shadow" {
			mode = 0o640
		}
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), mode); err != nil {
			return err
		}
	}
	return nil
}

// copyTree copies a file, symlink or directory tree; a missing src is no
// error. Special files are skipped.
func copyTree(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	case fi.IsDir():
		if err := os.Mkdir(dst, fi.Mode().Perm()); err != nil {
			return err
		}
		entries, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := copyTree(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				return err
			}
		}
		return nil
	case fi.Mode().IsRegular():
		return copyFile(src, dst, fi.Mode().Perm())
	}
	return nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// treeHash hashes names, modes, link targets and contents under dir.
func treeHash(dir string) (string, error) {
	h := sha256.New()
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			paths = append(paths, p)
		}
		return err
	})
	if err != nil {
		return "", err
	}
	sort.Strings(paths)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s\x00%o\x00", rel, fi.Mode())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, _ := os.Readlink(p)
			io.WriteString(h, t)
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return "", err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return "", err
			}
		}
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
