package server

import (
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

func (s *Server) fileAccess(r *http.Request, id string) (string, backend.FileAccessor, error) {
	sid, err := s.live(r, id)
	if err != nil {
		return "", nil, err
	}
	fa, ok := s.mgr.Backend().(backend.FileAccessor)
	if !ok {
		return "", nil, errdefs.New(errdefs.ErrNotImplemented, "backend %s has no file access", s.mgr.Backend().Name())
	}
	return sid, fa, nil
}

func toAPIFile(fi backend.FileInfo) api.FileInfo {
	t := api.File
	switch {
	case fi.IsDir:
		t = api.Dir
	case fi.Mode&fs.ModeSymlink != 0:
		t = api.Symlink
	case !fi.Mode.IsRegular():
		t = api.Other
	}
	mode := uint32(fi.Mode.Perm())
	if fi.Mode&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if fi.Mode&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if fi.Mode&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return api.FileInfo{Name: fi.Name, Path: fi.Path, Size: fi.Size, Mode: "0" + strconv.FormatUint(uint64(mode), 8),
		Type: t, IsDir: fi.IsDir, LinkTarget: fi.Link, Uid: fi.UID, Gid: fi.GID, ModifiedAt: fi.ModTime}
}

// parseMode reads octal permission bits ("0644", "755"); empty is def.
func parseMode(s string, def fs.FileMode) (fs.FileMode, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil || n > 0o7777 {
		return 0, invalid("mode %q: want octal permission bits such as 0644", s)
	}
	m := fs.FileMode(n & 0o777)
	if n&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if n&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if n&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m, nil
}

// checkUploadPath refuses, before a byte of the body is read or sent on,
// a path the agent would refuse anyway.
func checkUploadPath(p string) error {
	if p == "" || strings.IndexByte(p, 0) >= 0 {
		return invalid("path %q: want a non-empty path without NUL bytes", p)
	}
	return nil
}

// ReadFile implements api.ServerInterface.
func (s *Server) ReadFile(w http.ResponseWriter, r *http.Request, id api.SandboxID, params api.ReadFileParams) {
	sid, fa, err := s.fileAccess(r, id)
	var rc io.ReadCloser
	if err == nil {
		rc, err = fa.ReadFile(r.Context(), sid, params.Path)
	}
	s.sendStream(w, r, "application/octet-stream", rc, err)
}

// sendStream answers with rc's bytes, or with err.
func (s *Server) sendStream(w http.ResponseWriter, r *http.Request, contentType string, rc io.ReadCloser, err error) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", contentType)
	_, _ = io.Copy(w, rc)
}

// WriteFile implements api.ServerInterface.
func (s *Server) WriteFile(w http.ResponseWriter, r *http.Request, id api.SandboxID, params api.WriteFileParams) {
	mode, err := parseMode(params.Mode, 0o644)
	if err == nil {
		err = checkUploadPath(params.Path)
	}
	var sid string
	var fa backend.FileAccessor
	if err == nil {
		sid, fa, err = s.fileAccess(r, id)
	}
	if err == nil {
		err = fa.WriteFile(r.Context(), sid, params.Path, mode, r.Body)
	}
	var fi backend.FileInfo
	if err == nil {
		fi, err = fa.Stat(r.Context(), sid, params.Path)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPIFile(fi))
}

// RemoveFile implements api.ServerInterface.
func (s *Server) RemoveFile(w http.ResponseWriter, r *http.Request, id api.SandboxID, params api.RemoveFileParams) {
	sid, fa, err := s.fileAccess(r, id)
	if err == nil {
		err = fa.Remove(r.Context(), sid, params.Path, params.Recursive)
		if params.Force && errdefs.Code(err) == "not_found" {
			err = nil
		}
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// StatFile implements api.ServerInterface.
func (s *Server) StatFile(w http.ResponseWriter, r *http.Request, id api.SandboxID, params api.StatFileParams) {
	sid, fa, err := s.fileAccess(r, id)
	var fi backend.FileInfo
	if err == nil {
		fi, err = fa.Stat(r.Context(), sid, params.Path)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPIFile(fi))
}

// FileExists implements api.ServerInterface.
func (s *Server) FileExists(w http.ResponseWriter, r *http.Request, id api.SandboxID, params api.FileExistsParams) {
	sid, fa, err := s.fileAccess(r, id)
	if err != nil { // a missing sandbox is 404, not "no such file"
		s.fail(w, r, err)
		return
	}
	_, err = fa.Stat(r.Context(), sid, params.Path)
	if err != nil && errdefs.Code(err) != "not_found" {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.Exists{Exists: err == nil})
}

// ListFiles implements api.ServerInterface.
func (s *Server) ListFiles(w http.ResponseWriter, r *http.Request, id api.SandboxID, params api.ListFilesParams) {
	depth := 1
	if params.Depth != nil {
		depth = *params.Depth
	}
	if depth < 1 || depth > 64 {
		s.fail(w, r, invalid("depth %d: want 1-64", depth))
		return
	}
	sid, fa, err := s.fileAccess(r, id)
	var fis []backend.FileInfo
	if err == nil {
		fis, err = fa.List(r.Context(), sid, params.Path, backend.ListOptions{Depth: depth, Glob: params.Glob})
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := api.FileList{Files: make([]api.FileInfo, 0, len(fis))}
	for _, fi := range fis {
		out.Files = append(out.Files, toAPIFile(fi))
	}
	writeJSON(w, http.StatusOK, out)
}

// MakeDir implements api.ServerInterface.
func (s *Server) MakeDir(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.MkdirRequest
	err := decode(w, r, s.lim.MaxBodyBytes, &req)
	var mode fs.FileMode
	if err == nil {
		mode, err = parseMode(req.Mode, 0o755)
	}
	var sid string
	var fa backend.FileAccessor
	if err == nil {
		sid, fa, err = s.fileAccess(r, id)
	}
	if err == nil {
		err = fa.Mkdir(r.Context(), sid, req.Path, mode)
	}
	var fi backend.FileInfo
	if err == nil {
		fi, err = fa.Stat(r.Context(), sid, req.Path)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPIFile(fi))
}

// RenameFile implements api.ServerInterface.
func (s *Server) RenameFile(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.RenameRequest
	err := decode(w, r, s.lim.MaxBodyBytes, &req)
	var sid string
	var fa backend.FileAccessor
	if err == nil {
		sid, fa, err = s.fileAccess(r, id)
	}
	if err == nil {
		err = fa.Rename(r.Context(), sid, req.From, req.To)
	}
	var fi backend.FileInfo
	if err == nil {
		fi, err = fa.Stat(r.Context(), sid, req.To)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPIFile(fi))
}

func (s *Server) archiver(r *http.Request, id string) (string, backend.Archiver, error) {
	sid, err := s.live(r, id)
	if err != nil {
		return "", nil, err
	}
	ar, ok := s.mgr.Backend().(backend.Archiver)
	if !ok {
		return "", nil, errdefs.New(errdefs.ErrNotImplemented, "backend %s has no archives", s.mgr.Backend().Name())
	}
	return sid, ar, nil
}

// DownloadArchive implements api.ServerInterface.
func (s *Server) DownloadArchive(w http.ResponseWriter, r *http.Request, id api.SandboxID, params api.DownloadArchiveParams) {
	sid, ar, err := s.archiver(r, id)
	var rc io.ReadCloser
	if err == nil {
		rc, err = ar.ReadArchive(r.Context(), sid, params.Path)
	}
	s.sendStream(w, r, "application/x-tar", rc, err)
}

// UploadArchive implements api.ServerInterface.
func (s *Server) UploadArchive(w http.ResponseWriter, r *http.Request, id api.SandboxID, params api.UploadArchiveParams) {
	err := checkUploadPath(params.Path)
	var sid string
	var ar backend.Archiver
	if err == nil {
		sid, ar, err = s.archiver(r, id)
	}
	if err == nil {
		err = ar.WriteArchive(r.Context(), sid, params.Path, r.Body)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
