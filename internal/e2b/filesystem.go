package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/hutch-dev/hutch/internal/backend"
	fspb "github.com/hutch-dev/hutch/internal/e2b/envdpb/filesystem"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// filesystemService is envd's filesystem.Filesystem on the backend's file
// operations, which run inside the sandbox.
type filesystemService struct {
	h *Handler
}

func entry(fi backend.FileInfo) *fspb.EntryInfo {
	t := fspb.FileType_FILE_TYPE_FILE
	switch {
	case fi.Mode&fs.ModeSymlink != 0:
		t = fspb.FileType_FILE_TYPE_SYMLINK
	case fi.IsDir:
		t = fspb.FileType_FILE_TYPE_DIRECTORY
	}
	e := &fspb.EntryInfo{Name: fi.Name, Type: t, Path: fi.Path, Size: fi.Size, Mode: uint32(fi.Mode.Perm()),
		Permissions: fi.Mode.String(), Owner: owner(fi.UID), Group: owner(fi.GID), ModifiedTime: timestamppb.New(fi.ModTime)}
	if fi.Link != "" {
		e.SymlinkTarget = &fi.Link
	}
	return e
}

// owner names an in-sandbox id; hutch's bases have no user database to
// consult from here, so only root has a name.
func owner(id int) string {
	if id == 0 {
		return "root"
	}
	return strconv.Itoa(id)
}

func (s *filesystemService) target(ctx context.Context) (string, backend.FileAccessor, error) {
	id, err := sandboxID(ctx)
	if err != nil {
		return "", nil, err
	}
	fa, err := s.h.files()
	return id, fa, err
}

func (s *filesystemService) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	id, fa, err := s.target(ctx)
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	fi, err := fa.Stat(ctx, id, req.Msg.GetPath())
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: entry(fi)}), nil
}

// MakeDir creates a directory and its parents; an existing one is
// AlreadyExists, which the SDK reports as false.
func (s *filesystemService) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	id, fa, err := s.target(ctx)
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	p := req.Msg.GetPath()
	if fi, err := fa.Stat(ctx, id, p); err == nil {
		if fi.IsDir {
			return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("directory "+p+" already exists"))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New(p+" exists and is not a directory"))
	}
	if err := fa.Mkdir(ctx, id, p, 0o755); err != nil {
		return nil, s.h.rpcError(err)
	}
	fi, err := fa.Stat(ctx, id, p)
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: entry(fi)}), nil
}

func (s *filesystemService) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	id, fa, err := s.target(ctx)
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	if err := fa.Rename(ctx, id, req.Msg.GetSource(), req.Msg.GetDestination()); err != nil {
		return nil, s.h.rpcError(err)
	}
	fi, err := fa.Stat(ctx, id, req.Msg.GetDestination())
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: entry(fi)}), nil
}

// ListDir lists down to depth levels (1, the directory's own entries, when
// unset).
func (s *filesystemService) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	id, fa, err := s.target(ctx)
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	depth := int(min(max(req.Msg.GetDepth(), 1), 100))
	files, err := fa.List(ctx, id, req.Msg.GetPath(), backend.ListOptions{Depth: depth})
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	out := &fspb.ListDirResponse{Entries: make([]*fspb.EntryInfo, 0, len(files))}
	for _, fi := range files {
		out.Entries = append(out.Entries, entry(fi))
	}
	return connect.NewResponse(out), nil
}

// Remove removes a file or a whole directory tree.
func (s *filesystemService) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	id, fa, err := s.target(ctx)
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	if err := fa.Remove(ctx, id, req.Msg.GetPath(), true); err != nil {
		return nil, s.h.rpcError(err)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

// watch starts a backend watch for a WatchDir or CreateWatcher request.
func (s *filesystemService) watch(ctx context.Context, p string, recursive, includeEntry bool) (backend.WatchStream, string, error) {
	if includeEntry {
		return nil, "", errdefs.New(errdefs.ErrNotImplemented, "watch events with entry info are not supported")
	}
	id, fa, err := s.target(ctx)
	if err != nil {
		return nil, "", err
	}
	w, ok := s.h.cfg.Manager.Backend().(backend.Watcher)
	if !ok {
		return nil, "", errdefs.New(errdefs.ErrNotImplemented, "the %s backend cannot watch directories", s.h.cfg.Manager.Backend().Name())
	}
	fi, err := fa.Stat(ctx, id, p)
	if err != nil {
		return nil, "", err
	}
	if !fi.IsDir {
		return nil, "", errdefs.New(errdefs.ErrInvalidArgument, "%s is not a directory", p)
	}
	ws, err := w.Watch(ctx, id, fi.Path, recursive)
	return ws, fi.Path, err
}

// fsEvent turns a backend event into envd's, named relative to the
// watched directory as envd names them.
func fsEvent(root string, ev backend.WatchEvent) *fspb.FilesystemEvent {
	name := strings.TrimPrefix(strings.TrimPrefix(ev.Path, root), "/")
	if name == "" {
		name = path.Base(ev.Path)
	}
	t := map[backend.WatchOp]fspb.EventType{
		backend.WatchCreate: fspb.EventType_EVENT_TYPE_CREATE, backend.WatchWrite: fspb.EventType_EVENT_TYPE_WRITE,
		backend.WatchRemove: fspb.EventType_EVENT_TYPE_REMOVE, backend.WatchRename: fspb.EventType_EVENT_TYPE_RENAME,
		backend.WatchChmod: fspb.EventType_EVENT_TYPE_CHMOD,
	}[ev.Op]
	return &fspb.FilesystemEvent{Name: name, Type: t}
}

func (s *filesystemService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	m := req.Msg
	ws, root, err := s.watch(ctx, m.GetPath(), m.GetRecursive(), m.GetIncludeEntry())
	if err != nil {
		return s.h.rpcError(err)
	}
	defer ws.Close()
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	events := make(chan backend.WatchEvent)
	errc := make(chan error, 1)
	go func() { // owned: ends when ws is closed (deferred above)
		for {
			ev, err := ws.Next()
			if err != nil {
				errc <- err
				return
			}
			select {
			case events <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	tick := time.NewTicker(keepaliveOf(req.Header()))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return s.h.rpcError(err)
		case <-tick.C:
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case ev := <-events:
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: fsEvent(root, ev)}}); err != nil {
				return err
			}
		}
	}
}

// maxPolled bounds the events a polling watcher keeps between polls.
const maxPolled = 10000

// watchers are the polling watchers (CreateWatcher / GetWatcherEvents /
// RemoveWatcher): each collects its events until it is polled or removed.
type watchers struct {
	mu sync.Mutex
	m  map[string]*polled
}

type polled struct {
	sandbox string
	root    string
	ws      backend.WatchStream
	mu      sync.Mutex
	events  []*fspb.FilesystemEvent
	err     error
	done    chan struct{}
}

func newWatchers() *watchers { return &watchers{m: map[string]*polled{}} }

func (ws *watchers) add(sandbox, root string, stream backend.WatchStream) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	p := &polled{sandbox: sandbox, root: root, ws: stream, done: make(chan struct{})}
	ws.mu.Lock()
	ws.m[id] = p
	ws.mu.Unlock()
	go p.collect() // owned by the table: remove or closeAll closes ws, which ends it
	return id
}

func (p *polled) collect() {
	defer close(p.done)
	for {
		ev, err := p.ws.Next()
		p.mu.Lock()
		if err != nil {
			p.err = err
			p.mu.Unlock()
			return
		}
		if len(p.events) < maxPolled {
			p.events = append(p.events, fsEvent(p.root, ev))
		}
		p.mu.Unlock()
	}
}

func (ws *watchers) get(sandbox, id string) (*polled, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	p, ok := ws.m[id]
	if !ok || p.sandbox != sandbox {
		return nil, errdefs.New(errdefs.ErrNotFound, "watcher %q", id)
	}
	return p, nil
}

func (ws *watchers) remove(sandbox, id string) error {
	p, err := ws.get(sandbox, id)
	if err != nil {
		return err
	}
	ws.mu.Lock()
	delete(ws.m, id)
	ws.mu.Unlock()
	_ = p.ws.Close()
	<-p.done
	return nil
}

// sandboxes lists the sandboxes that have polling watchers.
func (ws *watchers) sandboxes() []string {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	out := make([]string, 0, len(ws.m))
	for _, p := range ws.m {
		out = append(out, p.sandbox)
	}
	return out
}

// forget removes the watchers of a sandbox that is gone.
func (ws *watchers) forget(sandbox string) {
	ws.mu.Lock()
	var gone []*polled
	for id, p := range ws.m {
		if p.sandbox == sandbox {
			gone = append(gone, p)
			delete(ws.m, id)
		}
	}
	ws.mu.Unlock()
	for _, p := range gone {
		_ = p.ws.Close()
		<-p.done
	}
}

func (ws *watchers) closeAll() {
	ws.mu.Lock()
	all := ws.m
	ws.m = map[string]*polled{}
	ws.mu.Unlock()
	for _, p := range all {
		_ = p.ws.Close()
		<-p.done
	}
}

func (s *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	m := req.Msg
	// The watch outlives this request: it ends when removed.
	ws, root, err := s.watch(context.WithoutCancel(ctx), m.GetPath(), m.GetRecursive(), m.GetIncludeEntry())
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	id, _ := sandboxID(ctx)
	s.h.sweep(ctx)
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: s.h.watch.add(id, root, ws)}), nil
}

func (s *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	id, _ := sandboxID(ctx)
	p, err := s.h.watch.get(id, req.Msg.GetWatcherId())
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	p.mu.Lock()
	evs, werr := p.events, p.err
	p.events = nil
	p.mu.Unlock()
	if len(evs) == 0 && werr != nil && !errors.Is(werr, io.EOF) {
		return nil, s.h.rpcError(werr)
	}
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: evs}), nil
}

func (s *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	id, _ := sandboxID(ctx)
	if err := s.h.watch.remove(id, req.Msg.GetWatcherId()); err != nil {
		return nil, s.h.rpcError(err)
	}
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}
