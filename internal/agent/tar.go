package agent

import (
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/hutch-dev/hutch/internal/agent/proto"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/tarfs"
)

// handleTarGet streams a tar of the directory at req.Path: regular files,
// directories, symlinks, with modes, owners and times.
func (s *Server) handleTarGet(c *proto.Conn, req *proto.Request) {
	root, err := s.resolve(req.Path)
	if err == nil {
		var fi fs.FileInfo
		if fi, err = os.Stat(root); err == nil && !fi.IsDir() {
			err = fmt.Errorf("archive %s: not a directory: %w", root, errdefs.ErrFailedPrecondition)
		}
		err = fileError("archive", root, err)
	}
	if err != nil {
		reply(c, proto.Response{}, err)
		return
	}
	if err := c.WriteJSON(proto.TResponse, proto.Response{}); err != nil {
		return
	}
	w := proto.DataWriter{C: c}
	if err := tarfs.Write(w, root, tarfs.Options{Owners: true}); err != nil {
		reply(c, proto.Response{}, fileError("archive", root, err))
		return
	}
	_ = w.Close()
}

// handleTarPut extracts the client's tar into the directory at req.Path,
// through an os.Root so no entry (or symlink in its way) leaves it.
func (s *Server) handleTarPut(c *proto.Conn, req *proto.Request) {
	dir, err := s.resolve(req.Path)
	if err == nil {
		err = fileError("mkdir", dir, os.MkdirAll(dir, 0o755))
	}
	r := &proto.DataReader{C: c}
	if err == nil {
		err = fileError("extract", dir, tarfs.Extract(r, dir, tarfs.Options{Owners: true}))
	}
	_, _ = io.Copy(io.Discard, r) // drain what is left of the stream
	reply(c, proto.Response{}, err)
}
