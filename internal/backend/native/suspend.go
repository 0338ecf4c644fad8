package native

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/layer"
)

// maxRestoreBytes bounds what a restored writable layer may unpack to.
const maxRestoreBytes = 64 << 30

// Suspend implements backend.Suspender. The processes are frozen while the
// upper is read, so the archive is one consistent moment; only once store
// has kept it are they killed and the upper emptied.
func (b *Backend) Suspend(ctx context.Context, id string, store func(io.Reader) error) (backend.ArchiveStats, error) {
	unlock := b.lockID(id)
	defer unlock()
	s, thaw, err := b.freeze(id)
	if err != nil {
		return backend.ArchiveStats{}, fmt.Errorf("suspend %s: %w", id, err)
	}
	st, err := packTo(ctx, filepath.Join(s.dir, "upper"), s.state.UID, s.state.Size, store)
	if err != nil {
		thaw()
		return backend.ArchiveStats{}, fmt.Errorf("suspend %s: %w", id, err)
	}
	if err := s.stop(context.WithoutCancel(ctx)); err != nil {
		return backend.ArchiveStats{}, err
	}
	if err := resetDirs(s.dir); err != nil {
		return backend.ArchiveStats{}, fmt.Errorf("suspend %s: release the upper: %w", id, err)
	}
	return backend.ArchiveStats{Files: st.Files + st.Dirs + st.Links, Bytes: st.Bytes,
		Compressed: st.Compressed, SHA256: st.SHA256}, nil
}

// packTo streams a packed upper into store, returning the first error of
// either side (store's, when it gave up first).
func packTo(ctx context.Context, dir string, uid, size uint32, store func(io.Reader) error) (layer.Stats, error) {
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		err := store(pr)
		pr.CloseWithError(errOr(err, io.ErrUnexpectedEOF))
		errc <- err
	}()
	st, perr := layer.Pack(ctx, pw, dir, uid, size)
	pw.CloseWithError(perr)
	serr := <-errc
	if serr != nil {
		return st, serr
	}
	return st, perr
}

func errOr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

// Resume implements backend.Suspender.
func (b *Backend) Resume(ctx context.Context, id string, r io.Reader) (backend.Handle, error) {
	unlock := b.lockID(id)
	defer unlock()
	s, err := b.get(id)
	if err != nil {
		return backend.Handle{}, err
	}
	if s.alive() {
		return backend.Handle{}, &errdefs.TransitionError{ID: id, From: "running", To: "running"}
	}
	if err := resetDirs(s.dir); err != nil {
		return backend.Handle{}, err
	}
	if _, err := layer.Unpack(ctx, r, filepath.Join(s.dir, "upper"), s.state.UID, s.state.Size, maxRestoreBytes); err != nil {
		_ = resetDirs(s.dir)
		return backend.Handle{}, fmt.Errorf("resume %s: %w", id, err)
	}
	if err := b.start(ctx, s, nil); err != nil {
		return backend.Handle{}, err
	}
	return s.handle(), nil
}

// resetDirs empties a stopped sandbox's upper and work directories,
// keeping them (and their owner) for the next start.
func resetDirs(dir string) error {
	for _, d := range []string{"upper", "work"} {
		p := filepath.Join(dir, d)
		entries, err := os.ReadDir(p)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(p, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// Snapshot implements backend.Snapshotter: the upper, frozen for a
// consistent moment, copied into dst with its owners shifted to the
// in-sandbox uids, which an idmapped mount then shows as they were.
func (b *Backend) Snapshot(ctx context.Context, id, dst string) (backend.ArchiveStats, error) {
	unlock := b.lockID(id)
	defer unlock()
	s, thaw, err := b.freeze(id)
	if err != nil {
		return backend.ArchiveStats{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	defer thaw()
	st, err := layer.Copy(ctx, filepath.Join(s.dir, "upper"), dst, s.state.UID, 0, s.state.Size)
	if err != nil {
		return backend.ArchiveStats{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	return backend.ArchiveStats{Files: st.Files + st.Dirs + st.Links, Bytes: st.Bytes}, nil
}

// freeze freezes a running sandbox's processes for a consistent read of
// its upper. thaw undoes it, unless the sandbox was paused before: then it
// stays paused.
//
// While frozen this way the sandbox's directory holds frozenMark, which
// thaw (or stop) removes: a daemon killed mid-read leaves it behind, and
// the next daemon's adopt thaws the sandbox, which nothing else would (the
// manager records no pause, so it re-pauses nothing and thaws nothing).
func (b *Backend) freeze(id string) (s *sandbox, thaw func(), err error) {
	if s, err = b.running(id); err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	group, paused := s.group, s.paused
	s.mu.Unlock()
	if paused {
		return s, func() {}, nil
	}
	mark := filepath.Join(s.dir, frozenMark)
	if err := os.WriteFile(mark, nil, 0o600); err != nil {
		return nil, nil, fmt.Errorf("freeze: %w", err)
	}
	if err := group.Freeze(); err != nil {
		_ = os.Remove(mark)
		return nil, nil, fmt.Errorf("freeze: %w", err)
	}
	return s, func() {
		if group.Thaw() == nil {
			_ = os.Remove(mark)
		}
	}, nil
}

// frozenMark, in a sandbox's directory, says the backend froze it for a
// read of its own (see freeze), not for a Pause.
const frozenMark = "frozen-for-read"

// thawLeftFreeze thaws an adopted sandbox that a dead daemon froze for a
// read of its own and never thawed.
func (s *sandbox) thawLeftFreeze() {
	mark := filepath.Join(s.dir, frozenMark)
	if _, err := os.Lstat(mark); err != nil {
		return
	}
	if s.group != nil && s.alive() {
		if err := s.group.Thaw(); err != nil {
			return // the mark stays: the next adopt tries again
		}
	}
	_ = os.Remove(mark)
}
