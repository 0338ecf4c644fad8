package hutch

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/coder/websocket"

	"github.com/hutch-dev/hutch/api"
)

// maxMessage bounds one WebSocket message from the daemon (an output chunk
// is at most 8 MiB before base64).
const maxMessage = 16 << 20

// stdinChunk is the most stdin sent in one message.
const stdinChunk = 256 << 10

// dial opens a WebSocket to the URL of req (from a generated New*Request)
// with the client's credentials.
func (c *Client) dial(ctx context.Context, req *http.Request) (*websocket.Conn, error) {
	h := http.Header{}
	c.authorize(h)
	conn, resp, err := websocket.Dial(ctx, req.URL.String(), &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			body, _ := io.ReadAll(resp.Body)
			return nil, errorFromBody(resp.StatusCode, body, resp.Header)
		}
		return nil, c.transportErr(err)
	}
	conn.SetReadLimit(maxMessage)
	return conn, nil
}

func writeJSON(ctx context.Context, conn *websocket.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return conn.Write(ctx, websocket.MessageText, b)
}

// readEvent reads one text message as an event.
func readEvent(ctx context.Context, conn *websocket.Conn) (Event, error) {
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			return Event{}, err
		}
		if typ != websocket.MessageText {
			continue
		}
		return parseEvent(msg)
	}
}

func parseEvent(msg []byte) (Event, error) {
	var e api.ExecEvent
	if err := json.Unmarshal(msg, &e); err != nil {
		return Event{}, protocolError("event: %v", err)
	}
	return fromAPIEvent(e), nil
}

// Session is a command run over a WebSocket: stdin goes in while it runs,
// stdout and stderr come out, and it can be signalled. Read Stdout and
// Stderr (they buffer without bound until read) and call Wait.
type Session struct {
	ProcessID string
	PID       int

	conn           *websocket.Conn
	ctx            context.Context
	cancel         context.CancelFunc
	stdout, stderr *pipeBuffer
	done           chan struct{}
	status         *ExitStatus
	err            error
}

// ExecInteractive starts cmd over a WebSocket and returns once it runs.
// Cancelling ctx, or Close, hangs up, which kills the command.
func (s *Sandbox) ExecInteractive(ctx context.Context, cmd string, opts ...ExecOption) (*Session, error) {
	c := execConfig{req: api.ExecRequest{Cmd: cmd}}
	for _, o := range opts {
		o(&c)
	}
	req, err := api.NewExecWebSocketRequest(s.c.base, s.ID)
	if err != nil {
		return nil, err
	}
	conn, err := s.c.dial(ctx, req)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	ss := &Session{conn: conn, ctx: sctx, cancel: cancel, stdout: newPipeBuffer(), stderr: newPipeBuffer(),
		done: make(chan struct{})}
	if err := ss.start(ctx, c); err != nil {
		ss.Close()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { ss.Close() })
	go func() {
		ss.readLoop()
		stop()
	}()
	return ss, nil
}

func (ss *Session) start(ctx context.Context, c execConfig) error {
	if err := writeJSON(ctx, ss.conn, c.req); err != nil {
		return err
	}
	ev, err := readEvent(ctx, ss.conn)
	switch {
	case err != nil:
		return err
	case ev.Type == EventError:
		return ev.Err
	case ev.Type != EventStart:
		return protocolError("first event is %q, not start", ev.Type)
	}
	ss.ProcessID, ss.PID = ev.ProcessID, ev.PID
	if c.stdin != nil {
		_, err = ss.Write(c.stdin)
	}
	return err
}

func (ss *Session) readLoop() {
	defer close(ss.done)
	for {
		ev, err := readEvent(ss.ctx, ss.conn)
		if err == nil && ev.Type == EventOutput {
			if ev.Stream == Stderr {
				ss.stderr.Write(ev.Data)
			} else {
				ss.stdout.Write(ev.Data)
			}
			continue
		}
		switch {
		case err != nil:
			ss.err = errors.Join(errors.New("hutch: session ended before the command exited"), err)
		case ev.Type == EventExit:
			ss.status = ev.Exit
		case ev.Type == EventError:
			ss.err = ev.Err
		default:
			continue
		}
		ss.stdout.CloseWithError(ss.err)
		ss.stderr.CloseWithError(ss.err)
		ss.cancel()
		_ = ss.conn.CloseNow()
		return
	}
}

// Stdout is the command's standard output; it ends (io.EOF) at the exit.
func (ss *Session) Stdout() io.Reader { return ss.stdout }

// Stderr is the command's standard error; it ends (io.EOF) at the exit.
func (ss *Session) Stderr() io.Reader { return ss.stderr }

// Write sends p to the command's stdin.
func (ss *Session) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), stdinChunk)]
		if err := ss.input(api.StreamInput{Type: api.Stdin, Data: chunk}); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// CloseStdin closes the command's stdin (it sees end of file).
func (ss *Session) CloseStdin() error { return ss.input(api.StreamInput{Type: api.StdinClose}) }

// Signal sends a signal ("TERM", "SIGINT", "9") to the command's process
// group.
func (ss *Session) Signal(sig string) error {
	return ss.input(api.StreamInput{Type: api.Signal, Signal: sig})
}

// Resize changes the command's terminal size (commands on a terminal only).
func (ss *Session) Resize(rows, cols int) error {
	return ss.input(api.StreamInput{Type: api.Resize, Rows: rows, Cols: cols})
}

func (ss *Session) input(in api.StreamInput) error { return writeJSON(ss.ctx, ss.conn, in) }

// Wait waits for the command to exit and returns how it ended.
func (ss *Session) Wait() (*ExitStatus, error) {
	<-ss.done
	return ss.status, ss.err
}

// Close hangs up; a command still running is killed.
func (ss *Session) Close() error {
	ss.cancel()
	return ss.conn.CloseNow()
}

// pipeBuffer is an unbounded in-memory pipe: writes never block.
type pipeBuffer struct {
	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	closed bool
	err    error
}

func newPipeBuffer() *pipeBuffer {
	p := &pipeBuffer{}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func (p *pipeBuffer) Write(b []byte) {
	p.mu.Lock()
	p.buf = append(p.buf, b...)
	p.mu.Unlock()
	p.cond.Broadcast()
}

func (p *pipeBuffer) CloseWithError(err error) {
	p.mu.Lock()
	p.closed, p.err = true, err
	p.mu.Unlock()
	p.cond.Broadcast()
}

func (p *pipeBuffer) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.buf) == 0 && !p.closed {
		p.cond.Wait()
	}
	if len(p.buf) == 0 {
		if p.err != nil {
			return 0, p.err
		}
		return 0, io.EOF
	}
	n := copy(b, p.buf)
	p.buf = p.buf[n:]
	return n, nil
}
