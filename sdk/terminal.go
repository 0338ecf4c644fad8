package hutch

import (
	"context"
	"errors"
	"io"
	"net/url"
	"strconv"
	"sync"

	"github.com/coder/websocket"

	"github.com/hutch-dev/hutch/api"
)

// TerminalOptions describe a terminal.
type TerminalOptions struct {
	Cmd        string // default: the sandbox's login shell
	Cwd        string
	Env        map[string]string
	Rows, Cols int // default 24x80
	Tag        string
}

// OpenTerminal starts a shell (or Cmd) on a terminal, in the background:
// attach to it with AttachTerminal, detach and re-attach at will.
func (s *Sandbox) OpenTerminal(ctx context.Context, o TerminalOptions) (*Process, error) {
	req := api.OpenTerminalRequest{Cmd: o.Cmd, Cwd: o.Cwd, Env: o.Env, Rows: o.Rows, Cols: o.Cols, Tag: o.Tag}
	r, err := s.c.api.OpenTerminalWithResponse(ctx, s.ID, req)
	if err := s.c.check(r, err); err != nil {
		return nil, err
	}
	return process(r.JSON201)
}

// ResizeTerminal changes a terminal's size.
func (s *Sandbox) ResizeTerminal(ctx context.Context, id string, rows, cols int) error {
	r, err := s.c.api.ResizeTerminalWithResponse(ctx, s.ID, id, api.ResizeRequest{Rows: rows, Cols: cols})
	return s.c.check(r, err)
}

// Terminal is an attachment to a terminal: Read returns its output, Write
// sends keystrokes, Close detaches (the terminal runs on). Read returns
// io.EOF when the terminal's process exits (see Exit) or the daemon hangs
// up. Use Read from one goroutine; Write, Resize and Close from any.
type Terminal struct {
	ProcessID string
	PID       int

	conn    *websocket.Conn
	ctx     context.Context
	cancel  context.CancelFunc
	pending []byte
	mu      sync.Mutex
	exit    *ExitStatus
}

// AttachTerminal attaches to the terminal id. The first output replays up
// to scrollback bytes of what it printed before; a negative scrollback
// takes the daemon's default (64 KiB). ctx bounds only the attaching.
func (s *Sandbox) AttachTerminal(ctx context.Context, id string, scrollback int) (*Terminal, error) {
	req, err := api.NewTerminalWebSocketRequest(s.c.base, s.ID, id, nil)
	if err != nil {
		return nil, err
	}
	if scrollback >= 0 {
		req.URL.RawQuery = url.Values{"scrollback": {strconv.Itoa(scrollback)}}.Encode()
	}
	conn, err := s.c.dial(ctx, req)
	if err != nil {
		return nil, err
	}
	ev, err := readEvent(ctx, conn)
	if err == nil && ev.Type != EventStart {
		err = protocolError("first event is %q, not start", ev.Type)
	}
	if err != nil {
		_ = conn.CloseNow()
		return nil, err
	}
	tctx, cancel := context.WithCancel(context.Background())
	return &Terminal{ProcessID: ev.ProcessID, PID: ev.PID, conn: conn, ctx: tctx, cancel: cancel}, nil
}

// Read reads terminal output.
func (t *Terminal) Read(p []byte) (int, error) {
	for len(t.pending) == 0 {
		typ, msg, err := t.conn.Read(t.ctx)
		if err != nil {
			return 0, t.readErr(err)
		}
		if typ == websocket.MessageBinary {
			t.pending = msg
			continue
		}
		if done, err := t.event(msg); done {
			return 0, err
		}
	}
	n := copy(p, t.pending)
	t.pending = t.pending[n:]
	return n, nil
}

// event handles a text frame; done says the stream is over.
func (t *Terminal) event(msg []byte) (done bool, err error) {
	ev, err := parseEvent(msg)
	switch {
	case err != nil:
		return true, err
	case ev.Type == EventExit:
		t.mu.Lock()
		t.exit = ev.Exit
		t.mu.Unlock()
		return true, io.EOF
	case ev.Type == EventError:
		return true, ev.Err
	}
	return false, nil
}

func (t *Terminal) readErr(err error) error {
	if websocket.CloseStatus(err) == websocket.StatusNormalClosure || errors.Is(err, context.Canceled) {
		return io.EOF
	}
	return err
}

// Write sends keystrokes.
func (t *Terminal) Write(p []byte) (int, error) {
	if err := t.conn.Write(t.ctx, websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Resize changes the terminal's size.
func (t *Terminal) Resize(rows, cols int) error {
	return writeJSON(t.ctx, t.conn, api.StreamInput{Type: api.Resize, Rows: rows, Cols: cols})
}

// Exit returns how the terminal's process ended, once Read has returned
// io.EOF for its exit; nil while it runs or after a detach.
func (t *Terminal) Exit() *ExitStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.exit
}

// Close detaches; the terminal's process runs on.
func (t *Terminal) Close() error {
	_ = t.conn.Close(websocket.StatusNormalClosure, "detach") // already closed is fine
	t.cancel()
	return nil
}
