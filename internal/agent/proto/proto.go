// Package proto is the wire protocol between the hutch daemon and the agent
// that runs as PID 1 inside each sandbox. It is a small framed protocol over
// a unix socket, one connection per request: a frame is a type byte, a
// 4-byte big-endian length and a payload. It is ours end to end, so it is
// kept simpler (and faster) than HTTP: a request frame, then stream frames
// in both directions.
package proto

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Frame types.
const (
	TRequest    byte = 'Q' // client → agent: JSON Request
	TResponse   byte = 'R' // agent → client: JSON Response
	TStarted    byte = 'B' // agent → client: JSON Started
	TOutput     byte = 'O' // agent → client: stream byte, 8-byte seq, data
	TExit       byte = 'X' // agent → client: JSON Exit
	TStdin      byte = 'I' // client → agent: data for stdin
	TStdinClose byte = 'C' // client → agent: close stdin
	TSignal     byte = 'S' // client → agent: JSON Signal
	TResize     byte = 'Z' // client → agent: JSON Resize
	TData       byte = 'D' // either way: file content
	TEOF        byte = 'E' // either way: end of file content
	TWatch      byte = 'W' // agent → client: JSON backend.WatchEvent
)

// MaxFrame bounds one frame's payload; larger frames are a protocol error.
const MaxFrame = 8 << 20

// DataChunk is the largest payload DataWriter puts in one frame.
const DataChunk = 256 << 10

// Ops a Request can name.
const (
	OpPing   = "ping"
	OpExec   = "exec"
	OpAttach = "attach"
	OpPs     = "ps"
	OpSignal = "signal"
	// OpResize sets a PTY's window size and answers once it is set, so
	// input sent after the answer sees the new size (a TResize frame on an
	// attached stream gives no such order).
	OpResize  = "resize"
	OpRead    = "read"
	OpWrite   = "write"
	OpStat    = "stat"
	OpList    = "list"
	OpMkdir   = "mkdir"
	OpRemove  = "remove"
	OpRename  = "rename"
	OpProcess = "process"
	OpStdin   = "stdin"
	OpTarGet  = "tar.get"
	OpTarPut  = "tar.put"
	// OpWatch answers a Response, then TWatch frames until the client
	// closes the connection.
	OpWatch = "watch"
)

// Request is the first frame of every connection.
type Request struct {
	Op        string               `json:"op"`
	Exec      *backend.ExecRequest `json:"exec,omitempty"`
	ProcID    string               `json:"proc_id,omitempty"`
	FromSeq   uint64               `json:"from_seq,omitempty"`
	Signal    int                  `json:"signal,omitempty"`
	Path      string               `json:"path,omitempty"`
	To        string               `json:"to,omitempty"`
	Mode      uint32               `json:"mode,omitempty"`
	Recursive bool                 `json:"recursive,omitempty"`
	Close     bool                 `json:"close,omitempty"`
	List      backend.ListOptions  `json:"list,omitempty"`
	Rows      uint16               `json:"rows,omitempty"` // OpResize
	Cols      uint16               `json:"cols,omitempty"`
}

// Response answers a Request (or ends a write).
type Response struct {
	Error     *Error                `json:"error,omitempty"`
	Info      *backend.FileInfo     `json:"info,omitempty"`
	Files     []backend.FileInfo    `json:"files,omitempty"`
	Processes []backend.ProcessInfo `json:"processes,omitempty"`
	Process   *backend.ProcessInfo  `json:"process,omitempty"`
}

// Error carries an errdefs class across the socket.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Err turns a wire error back into one that matches its errdefs class.
func (e *Error) Err() error {
	if e == nil {
		return nil
	}
	class := errdefs.FromCode(e.Code)
	if class == nil {
		return errors.New(e.Message)
	}
	return &wireError{msg: e.Message, class: class}
}

type wireError struct {
	msg   string
	class error
}

func (e *wireError) Error() string { return e.msg }
func (e *wireError) Unwrap() error { return e.class }

// ToWire converts an error for sending.
func ToWire(err error) *Error {
	if err == nil {
		return nil
	}
	return &Error{Code: errdefs.Code(err), Message: err.Error()}
}

// Started says a process is running.
type Started struct {
	ID  string `json:"id"`
	Pid int    `json:"pid"`
}

// Exit is the last frame of a process stream.
type Exit struct {
	Seq    uint64             `json:"seq"`
	Status backend.ExitStatus `json:"status"`
}

// Signal asks for a signal to the process group.
type Signal struct {
	Signal int `json:"signal"`
}

// Resize changes a PTY's window size.
type Resize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Conn frames a byte stream. Writes are serialized; reads are not (one
// reader per Conn).
type Conn struct {
	r   *bufio.Reader
	w   io.Writer
	wmu sync.Mutex
	hdr [5]byte
	c   io.Closer
}

// NewConn wraps rw; Close closes rw if it is an io.Closer.
func NewConn(rw io.ReadWriter) *Conn {
	c := &Conn{r: bufio.NewReaderSize(rw, 64<<10), w: rw}
	c.c, _ = rw.(io.Closer)
	return c
}

// Close closes the underlying stream.
func (c *Conn) Close() error {
	if c.c == nil {
		return nil
	}
	return c.c.Close()
}

// WriteFrame sends one frame whose payload is the concatenation of parts.
func (c *Conn) WriteFrame(t byte, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n > MaxFrame {
		return fmt.Errorf("frame of %d bytes: %w", n, errdefs.ErrTooLarge)
	}
	buf := make([]byte, 5, 5+n)
	buf[0] = t
	binary.BigEndian.PutUint32(buf[1:], uint32(n))
	for _, p := range parts {
		buf = append(buf, p...)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.w.Write(buf)
	return err
}

// WriteJSON sends a frame whose payload is v as JSON.
func (c *Conn) WriteJSON(t byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.WriteFrame(t, b)
}

// WriteOutput sends one output chunk.
func (c *Conn) WriteOutput(stream backend.Stream, seq uint64, data []byte) error {
	var h [9]byte
	h[0] = byte(stream)
	binary.BigEndian.PutUint64(h[1:], seq)
	return c.WriteFrame(TOutput, h[:], data)
}

// ReadFrame reads the next frame. The payload is a fresh slice.
func (c *Conn) ReadFrame() (byte, []byte, error) {
	if _, err := io.ReadFull(c.r, c.hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(c.hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes: %w", n, errdefs.ErrTooLarge)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(c.r, p); err != nil {
		return 0, nil, unexpected(err)
	}
	return c.hdr[0], p, nil
}

// ReadJSON reads a frame that must be of type t and decodes it into v.
func (c *Conn) ReadJSON(t byte, v any) error {
	got, p, err := c.ReadFrame()
	if err != nil {
		return err
	}
	if got != t {
		return fmt.Errorf("protocol: got frame %q, want %q", got, t)
	}
	return json.Unmarshal(p, v)
}

// ParseOutput splits a TOutput payload.
func ParseOutput(p []byte) (backend.Stream, uint64, []byte, error) {
	if len(p) < 9 {
		return 0, 0, nil, errors.New("protocol: short output frame")
	}
	return backend.Stream(p[0]), binary.BigEndian.Uint64(p[1:9]), p[9:], nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// DataWriter sends everything written to it as TData frames of at most
// MaxFrame bytes; Close sends TEOF.
type DataWriter struct{ C *Conn }

func (d DataWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), DataChunk)
		if err := d.C.WriteFrame(TData, p[:k]); err != nil {
			return n, err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// Close ends the data stream.
func (d DataWriter) Close() error { return d.C.WriteFrame(TEOF) }

// DataReader reads TData frames until TEOF. A TResponse frame in their
// place carries an error, which Read returns.
type DataReader struct {
	C   *Conn
	buf []byte
	err error
}

func (d *DataReader) Read(p []byte) (int, error) {
	for len(d.buf) == 0 {
		if d.err != nil {
			return 0, d.err
		}
		t, payload, err := d.C.ReadFrame()
		switch {
		case err != nil:
			d.err = unexpected(err)
		case t == TData:
			d.buf = payload
		case t == TEOF:
			d.err = io.EOF
		case t == TResponse:
			var r Response
			if jerr := json.Unmarshal(payload, &r); jerr != nil {
				d.err = jerr
			} else if r.Error != nil {
				d.err = r.Error.Err()
			} else {
				d.err = errors.New("protocol: response in data stream")
			}
		default:
			d.err = fmt.Errorf("protocol: unexpected frame %q in data stream", t)
		}
	}
	n := copy(p, d.buf)
	d.buf = d.buf[n:]
	return n, nil
}
