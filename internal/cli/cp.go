package cli

import (
	"context"
	"errors"
	"fmt"
	"github.com/hutch-dev/hutch/internal/tarfs"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	hutch "github.com/hutch-dev/hutch/sdk"
)

func cpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between the host and a sandbox",
		Long: "cp copies between a local path and ID:PATH in a sandbox (relative sandbox paths are under " +
			"/workspace), either way. A directory is copied whole, through a tar archive. When DST is an " +
			"existing directory, SRC is copied into it under its own name. A local - is standard input or " +
			"output: a file's bytes, or the tar of a sandbox directory.",
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseLoc(args[0]), parseLoc(args[1])
			switch {
			case src.id == "" && dst.id != "":
				return g.upload(cmd.Context(), src.path, dst)
			case src.id != "" && dst.id == "":
				return g.download(cmd.Context(), src, dst.path)
			}
			return invalid("cp: one of SRC and DST must be ID:PATH in a sandbox, the other a local path")
		},
	}
}

// loc is one side of a copy: a local path (id "") or a sandbox path.
type loc struct{ id, path string }

var sandboxIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

func parseLoc(s string) loc {
	if id, p, ok := strings.Cut(s, ":"); ok && sandboxIDPattern.MatchString(id) {
		if p == "" {
			p = "."
		}
		return loc{id: id, path: p}
	}
	return loc{path: s}
}

// upload copies the local src to dst in a sandbox.
func (g *globals) upload(ctx context.Context, src string, dst loc) error {
	sb, err := g.sandbox(dst.id)
	if err != nil {
		return err
	}
	if src == "-" {
		return sb.WriteFileFrom(ctx, dst.path, os.Stdin, 0)
	}
	fi, err := os.Stat(src)
	if err != nil {
		return localErr(err)
	}
	target := dst.path
	if rfi, err := sb.Stat(ctx, dst.path); err == nil && rfi.IsDir() || strings.HasSuffix(dst.path, "/") {
		target = path.Join(dst.path, filepath.Base(src))
	} else if err != nil && !errors.Is(err, hutch.ErrNotFound) {
		return err
	}
	if !fi.IsDir() {
		f, err := os.Open(src)
		if err != nil {
			return localErr(err)
		}
		defer f.Close()
		return sb.WriteFileFrom(ctx, target, f, fi.Mode().Perm())
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarfs.Write(pw, src, tarfs.Options{})) }()
	defer pr.Close()
	return sb.UploadArchive(ctx, target, pr)
}

// download copies src in a sandbox to the local dst.
func (g *globals) download(ctx context.Context, src loc, dst string) error {
	sb, err := g.sandbox(src.id)
	if err != nil {
		return err
	}
	fi, err := sb.Stat(ctx, src.path)
	if err != nil {
		return err
	}
	var rc io.ReadCloser
	if fi.IsDir() {
		rc, err = sb.DownloadArchive(ctx, src.path)
	} else {
		rc, err = sb.ReadFileStream(ctx, src.path)
	}
	if err != nil {
		return err
	}
	defer rc.Close()
	if dst == "-" {
		_, err = io.Copy(os.Stdout, rc)
		return err
	}
	target := dst
	if lfi, err := os.Stat(dst); err == nil && lfi.IsDir() {
		target = filepath.Join(dst, path.Base(src.path))
	}
	if fi.IsDir() {
		if err := os.MkdirAll(target, 0o755); err != nil {
			return localErr(err)
		}
		return localErr(tarfs.Extract(rc, target, tarfs.Options{}))
	}
	return localErr(writeLocal(target, rc, fi.Mode.Perm()))
}

// writeLocal writes r to a temporary file next to target, then renames it.
func writeLocal(target string, r io.Reader, mode fs.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(target), ".hutch-cp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), target)
}

// localErr classes a local file error like the daemon classes its own.
func localErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %w", err, hutch.ErrNotFound)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: %w", err, hutch.ErrPermissionDenied)
	}
	return err
}
