package hutch

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"

	"github.com/hutch-dev/hutch/api"
)

// Paths are paths inside the sandbox; relative ones are under /workspace.

// ReadFile returns a file's content. A missing file is an error matching
// ErrNotFound; see ReadFileIfExists.
func (s *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	rc, err := s.ReadFileStream(ctx, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// ReadFileIfExists is ReadFile where a missing file is no error: it returns
// ok false instead.
func (s *Sandbox) ReadFileIfExists(ctx context.Context, path string) (data []byte, ok bool, err error) {
	data, err = s.ReadFile(ctx, path)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	return data, true, nil
}

// ReadFileStream opens a file for reading; close the reader when done.
func (s *Sandbox) ReadFileStream(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := s.c.api.ReadFile(ctx, s.ID, &api.ReadFileParams{Path: path})
	if err := s.c.checkHTTP(resp, err); err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFile writes data to a file atomically, creating parent directories.
// A zero mode means 0644.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error {
	return s.WriteFileFrom(ctx, path, bytes.NewReader(data), mode)
}

// WriteFileFrom writes a file from r, streaming; like WriteFile otherwise.
func (s *Sandbox) WriteFileFrom(ctx context.Context, path string, r io.Reader, mode fs.FileMode) error {
	p := api.WriteFileParams{Path: path}
	if mode != 0 {
		p.Mode = modeString(mode)
	}
	resp, err := s.c.api.WriteFileWithBodyWithResponse(ctx, s.ID, &p, "application/octet-stream", r)
	return s.c.check(resp, err)
}

// Stat describes a path; a final symlink is not followed.
func (s *Sandbox) Stat(ctx context.Context, path string) (*FileInfo, error) {
	r, err := s.c.api.StatFileWithResponse(ctx, s.ID, &api.StatFileParams{Path: path})
	return fileInfo(s.c.check(r, err), r)
}

func fileInfo(err error, r interface{ GetJSON200() *api.FileInfo }) (*FileInfo, error) {
	if err != nil {
		return nil, err
	}
	fi, err := must(r.GetJSON200())
	if err != nil {
		return nil, err
	}
	return fromAPIFile(*fi), nil
}

// Exists reports whether a path exists.
func (s *Sandbox) Exists(ctx context.Context, path string) (bool, error) {
	r, err := s.c.api.FileExistsWithResponse(ctx, s.ID, &api.FileExistsParams{Path: path})
	if err := s.c.check(r, err); err != nil {
		return false, err
	}
	ex, err := must(r.JSON200)
	if err != nil {
		return false, err
	}
	return ex.Exists, nil
}

// ListFiles lists a directory to depth levels (0 means 1), keeping entries
// whose name matches glob when it is not empty.
func (s *Sandbox) ListFiles(ctx context.Context, path string, depth int, glob string) ([]FileInfo, error) {
	p := api.ListFilesParams{Path: path, Glob: glob}
	if depth > 0 {
		p.Depth = &depth
	}
	r, err := s.c.api.ListFilesWithResponse(ctx, s.ID, &p)
	if err := s.c.check(r, err); err != nil {
		return nil, err
	}
	list, err := must(r.JSON200)
	if err != nil {
		return nil, err
	}
	out := make([]FileInfo, 0, len(list.Files))
	for _, f := range list.Files {
		out = append(out, *fromAPIFile(f))
	}
	return out, nil
}

// Mkdir makes a directory and its parents (mkdir -p). A zero mode means
// 0755.
func (s *Sandbox) Mkdir(ctx context.Context, path string, mode fs.FileMode) error {
	req := api.MkdirRequest{Path: path}
	if mode != 0 {
		req.Mode = modeString(mode)
	}
	r, err := s.c.api.MakeDirWithResponse(ctx, s.ID, req)
	return s.c.check(r, err)
}

// RemoveOptions adjust Remove.
type RemoveOptions struct {
	Recursive bool // remove a directory and everything in it
	Force     bool // a missing path is no error
}

// Remove removes a file, or a directory with Recursive.
func (s *Sandbox) Remove(ctx context.Context, path string, o RemoveOptions) error {
	p := api.RemoveFileParams{Path: path, Recursive: o.Recursive, Force: o.Force}
	r, err := s.c.api.RemoveFileWithResponse(ctx, s.ID, &p)
	return s.c.check(r, err)
}

// Rename renames (moves) a path.
func (s *Sandbox) Rename(ctx context.Context, from, to string) error {
	r, err := s.c.api.RenameFileWithResponse(ctx, s.ID, api.RenameRequest{From: from, To: to})
	return s.c.check(r, err)
}

// DownloadArchive returns a tar of the directory at path (entries relative
// to it); close it when done.
func (s *Sandbox) DownloadArchive(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := s.c.api.DownloadArchive(ctx, s.ID, &api.DownloadArchiveParams{Path: path})
	if err := s.c.checkHTTP(resp, err); err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// UploadArchive extracts the tar read from r into the directory at path,
// creating it if missing. No entry may leave it.
func (s *Sandbox) UploadArchive(ctx context.Context, path string, r io.Reader) error {
	p := api.UploadArchiveParams{Path: path}
	resp, err := s.c.api.UploadArchiveWithBodyWithResponse(ctx, s.ID, &p, "application/x-tar", r)
	return s.c.check(resp, err)
}
