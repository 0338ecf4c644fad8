package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"sync"
	"syscall"

	"github.com/hutch-dev/hutch/internal/agent/proto"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Client talks to one sandbox's agent over its unix socket, one
// connection per request.
type Client struct {
	Socket string
}

func (cl *Client) dial(ctx context.Context, req proto.Request) (*proto.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", cl.Socket)
	if err != nil {
		return nil, fmt.Errorf("agent at %s: %v: %w", cl.Socket, err, errdefs.ErrUnavailable)
	}
	c := proto.NewConn(nc)
	if err := c.WriteJSON(proto.TRequest, req); err != nil {
		c.Close()
		return nil, fmt.Errorf("agent: %v: %w", err, errdefs.ErrUnavailable)
	}
	return c, nil
}

// closeOnDone closes c when ctx ends; the returned stop undoes that.
func closeOnDone(ctx context.Context, c *proto.Conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() { c.Close() })
}

// call sends req and reads its one response.
func (cl *Client) call(ctx context.Context, req proto.Request) (proto.Response, error) {
	c, err := cl.dial(ctx, req)
	if err != nil {
		return proto.Response{}, err
	}
	defer c.Close()
	defer closeOnDone(ctx, c)()
	var r proto.Response
	if err := c.ReadJSON(proto.TResponse, &r); err != nil {
		return r, connError(ctx, err)
	}
	return r, r.Error.Err()
}

func connError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%v: %w", ctx.Err(), errdefs.ErrDeadlineExceeded)
	}
	if errors.Is(err, errdefs.ErrTooLarge) {
		return err
	}
	return fmt.Errorf("agent connection: %v: %w", err, errdefs.ErrUnavailable)
}

// Ping checks the agent answers.
func (cl *Client) Ping(ctx context.Context) error {
	_, err := cl.call(ctx, proto.Request{Op: proto.OpPing})
	return err
}

// Exec starts a command.
func (cl *Client) Exec(ctx context.Context, req backend.ExecRequest) (backend.Process, error) {
	return cl.open(ctx, proto.Request{Op: proto.OpExec, Exec: &req})
}

// Attach follows a process's output from seq on.
func (cl *Client) Attach(ctx context.Context, procID string, fromSeq uint64) (backend.Process, error) {
	return cl.open(ctx, proto.Request{Op: proto.OpAttach, ProcID: procID, FromSeq: fromSeq})
}

func (cl *Client) open(ctx context.Context, req proto.Request) (backend.Process, error) {
	c, err := cl.dial(ctx, req)
	if err != nil {
		return nil, err
	}
	stop := closeOnDone(ctx, c)
	t, payload, err := c.ReadFrame()
	stop()
	if err != nil {
		c.Close()
		return nil, connError(ctx, err)
	}
	switch t {
	case proto.TStarted:
		var st proto.Started
		if err := json.Unmarshal(payload, &st); err != nil {
			c.Close()
			return nil, err
		}
		return &remoteProc{c: c, cl: cl, id: st.ID, pid: st.Pid}, nil
	case proto.TResponse:
		c.Close()
		var r proto.Response
		if err := json.Unmarshal(payload, &r); err != nil {
			return nil, err
		}
		if r.Error == nil {
			return nil, errors.New("agent: empty response to a process request")
		}
		return nil, r.Error.Err()
	}
	c.Close()
	return nil, fmt.Errorf("agent: unexpected frame %q", t)
}

// Processes lists the process table.
func (cl *Client) Processes(ctx context.Context) ([]backend.ProcessInfo, error) {
	r, err := cl.call(ctx, proto.Request{Op: proto.OpPs})
	return r.Processes, err
}

// Process describes one process.
func (cl *Client) Process(ctx context.Context, procID string) (backend.ProcessInfo, error) {
	r, err := cl.call(ctx, proto.Request{Op: proto.OpProcess, ProcID: procID})
	if err != nil || r.Process == nil {
		return backend.ProcessInfo{}, err
	}
	return *r.Process, nil
}

// Signal signals a process's group.
func (cl *Client) Signal(ctx context.Context, procID string, sig syscall.Signal) error {
	_, err := cl.call(ctx, proto.Request{Op: proto.OpSignal, ProcID: procID, Signal: int(sig)})
	return err
}

// Resize sets a PTY's window size; it is set when Resize returns.
func (cl *Client) Resize(ctx context.Context, procID string, rows, cols uint16) error {
	_, err := cl.call(ctx, proto.Request{Op: proto.OpResize, ProcID: procID, Rows: rows, Cols: cols})
	return err
}

// ReadFile streams a file's content.
func (cl *Client) ReadFile(ctx context.Context, p string) (io.ReadCloser, error) {
	return cl.download(ctx, proto.Request{Op: proto.OpRead, Path: p})
}

type fileReader struct {
	proto.DataReader
	stop func() bool
}

func (f *fileReader) Close() error {
	f.stop()
	return f.C.Close()
}

// WriteFile streams r into a file, replacing it atomically.
func (cl *Client) WriteFile(ctx context.Context, p string, mode fs.FileMode, r io.Reader) error {
	return cl.upload(ctx, proto.Request{Op: proto.OpWrite, Path: p, Mode: uint32(mode)}, r)
}

// Stat describes a path without following a final symlink.
func (cl *Client) Stat(ctx context.Context, p string) (backend.FileInfo, error) {
	r, err := cl.call(ctx, proto.Request{Op: proto.OpStat, Path: p})
	if err != nil || r.Info == nil {
		return backend.FileInfo{}, err
	}
	return *r.Info, nil
}

// List lists a directory.
func (cl *Client) List(ctx context.Context, p string, opts backend.ListOptions) ([]backend.FileInfo, error) {
	r, err := cl.call(ctx, proto.Request{Op: proto.OpList, Path: p, List: opts})
	return r.Files, err
}

// Mkdir makes a directory and its parents.
func (cl *Client) Mkdir(ctx context.Context, p string, mode fs.FileMode) error {
	_, err := cl.call(ctx, proto.Request{Op: proto.OpMkdir, Path: p, Mode: uint32(mode)})
	return err
}

// Remove removes a file, or a directory tree when recursive.
func (cl *Client) Remove(ctx context.Context, p string, recursive bool) error {
	_, err := cl.call(ctx, proto.Request{Op: proto.OpRemove, Path: p, Recursive: recursive})
	return err
}

// Rename renames a path.
func (cl *Client) Rename(ctx context.Context, from, to string) error {
	_, err := cl.call(ctx, proto.Request{Op: proto.OpRename, Path: from, To: to})
	return err
}

// remoteProc is a Process on the far side of an agent connection.
type remoteProc struct {
	c        *proto.Conn
	cl       *Client
	id       string
	pid      int
	mu       sync.Mutex
	done     bool
	closed   bool
	closeErr error
}

func (p *remoteProc) ID() string { return p.id }
func (p *remoteProc) Pid() int   { return p.pid }

func (p *remoteProc) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k := min(len(b), proto.DataChunk)
		if err := p.c.WriteFrame(proto.TStdin, b[:k]); err != nil {
			return n, err
		}
		n += k
		b = b[k:]
	}
	return n, nil
}

func (p *remoteProc) CloseStdin() error { return p.c.WriteFrame(proto.TStdinClose) }

func (p *remoteProc) Signal(ctx context.Context, sig syscall.Signal) error {
	return p.c.WriteJSON(proto.TSignal, proto.Signal{Signal: int(sig)})
}

func (p *remoteProc) Resize(ctx context.Context, rows, cols uint16) error {
	return p.c.WriteJSON(proto.TResize, proto.Resize{Rows: rows, Cols: cols})
}

func (p *remoteProc) Recv() (backend.Event, error) {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done {
		return backend.Event{}, io.EOF
	}
	t, payload, err := p.c.ReadFrame()
	if err != nil {
		return backend.Event{}, fmt.Errorf("process %s: %v: %w", p.id, err, errdefs.ErrUnavailable)
	}
	switch t {
	case proto.TOutput:
		stream, seq, data, err := proto.ParseOutput(payload)
		return backend.Event{Seq: seq, Stream: stream, Data: data}, err
	case proto.TExit:
		var x proto.Exit
		if err := json.Unmarshal(payload, &x); err != nil {
			return backend.Event{}, err
		}
		p.mu.Lock()
		p.done = true
		p.mu.Unlock()
		return backend.Event{Seq: x.Seq, Exit: &x.Status}, nil
	}
	return backend.Event{}, fmt.Errorf("agent: unexpected frame %q in a process stream", t)
}

func (p *remoteProc) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		p.closeErr = p.c.Close()
	}
	return nil
}

// WriteStdin writes r to a process's stdin, closing it afterwards if asked.
func (cl *Client) WriteStdin(ctx context.Context, procID string, r io.Reader, close bool) error {
	return cl.upload(ctx, proto.Request{Op: proto.OpStdin, ProcID: procID, Close: close}, r)
}

// ReadArchive streams a tar of a directory.
func (cl *Client) ReadArchive(ctx context.Context, p string) (io.ReadCloser, error) {
	return cl.download(ctx, proto.Request{Op: proto.OpTarGet, Path: p})
}

// WriteArchive extracts a tar into a directory.
func (cl *Client) WriteArchive(ctx context.Context, p string, r io.Reader) error {
	return cl.upload(ctx, proto.Request{Op: proto.OpTarPut, Path: p}, r)
}

// upload sends req, then r as data frames, and reads the one response.
func (cl *Client) upload(ctx context.Context, req proto.Request, r io.Reader) error {
	c, err := cl.dial(ctx, req)
	if err != nil {
		return err
	}
	defer c.Close()
	defer closeOnDone(ctx, c)()
	w := proto.DataWriter{C: c}
	var werr error
	if r != nil {
		_, werr = io.Copy(w, r)
	}
	if werr == nil {
		werr = w.Close()
	}
	// Even when sending failed, the agent may have answered why.
	var resp proto.Response
	if err := c.ReadJSON(proto.TResponse, &resp); err != nil {
		if werr != nil {
			return connError(ctx, werr)
		}
		return connError(ctx, err)
	}
	if resp.Error != nil {
		return resp.Error.Err()
	}
	if werr != nil {
		return connError(ctx, werr)
	}
	return nil
}

// download sends req, reads a response, then streams data frames.
func (cl *Client) download(ctx context.Context, req proto.Request) (io.ReadCloser, error) {
	c, stop, err := cl.openStream(ctx, req)
	if err != nil {
		return nil, err
	}
	return &fileReader{DataReader: proto.DataReader{C: c}, stop: stop}, nil
}

// openStream sends req and reads its response; on success the connection
// stays open for the frames that follow, closed when ctx ends (stop undoes
// that), and on failure it is closed.
func (cl *Client) openStream(ctx context.Context, req proto.Request) (*proto.Conn, func() bool, error) {
	c, err := cl.dial(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	stop := closeOnDone(ctx, c)
	var r proto.Response
	if err := c.ReadJSON(proto.TResponse, &r); err != nil {
		stop()
		c.Close()
		return nil, nil, connError(ctx, err)
	}
	if err := r.Error.Err(); err != nil {
		stop()
		c.Close()
		return nil, nil, err
	}
	return c, stop, nil
}
