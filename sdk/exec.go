package hutch

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"time"

	"github.com/hutch-dev/hutch/api"
)

// ExecOption adjusts a command run by Exec, ExecStream or ExecInteractive.
type ExecOption func(*execConfig)

type execConfig struct {
	req   api.ExecRequest
	stdin []byte
}

// WithCwd runs the command in dir (default: the sandbox's, /workspace).
func WithCwd(dir string) ExecOption { return func(c *execConfig) { c.req.Cwd = dir } }

// WithEnv adds environment variables on top of the sandbox's.
func WithEnv(env map[string]string) ExecOption {
	return func(c *execConfig) {
		if c.req.Env == nil {
			c.req.Env = map[string]string{}
		}
		maps.Copy(c.req.Env, env)
	}
}

// WithStdin gives the command this standard input (at most 1 MiB; for more,
// use ExecInteractive or a process). Exec and ExecStream only.
func WithStdin(data []byte) ExecOption { return func(c *execConfig) { c.stdin = data } }

// WithTimeout kills the command after d (default 300s, at most 1h).
func WithTimeout(d time.Duration) ExecOption {
	return func(c *execConfig) { c.req.Timeout = d.Seconds() }
}

// WithMaxOutput keeps up to n bytes of each stream (Exec only; default 64
// KiB). Beyond it the result says StdoutTruncated/StderrTruncated.
func WithMaxOutput(n int) ExecOption { return func(c *execConfig) { c.req.MaxOutput = n } }

// WithTag tags the command's process, so it can be found by tag.
func WithTag(tag string) ExecOption { return func(c *execConfig) { c.req.Tag = tag } }

// WithBackground keeps a streamed command running when the client goes
// away (ExecStream only); its output stays readable with ProcessOutput.
func WithBackground() ExecOption { return func(c *execConfig) { c.req.Background = true } }

func newExec(cmd string, opts []ExecOption) api.ExecRequest {
	c := execConfig{req: api.ExecRequest{Cmd: cmd}}
	for _, o := range opts {
		o(&c)
	}
	if c.stdin != nil {
		c.req.Stdin = base64.StdEncoding.EncodeToString(c.stdin)
		c.req.StdinEncoding = api.ExecRequestStdinEncodingBase64
	}
	return c.req
}

// ExecResult is a finished command: how it ended and what it printed.
type ExecResult struct {
	ExitStatus
	Stdout, Stderr                   []byte
	StdoutTruncated, StderrTruncated bool
	Duration                         time.Duration
}

// Exec runs cmd with sh -c and waits for it, keeping its output. A non-zero
// exit is a result, not an error.
func (s *Sandbox) Exec(ctx context.Context, cmd string, opts ...ExecOption) (*ExecResult, error) {
	req := newExec(cmd, opts)
	req.Encoding = api.ExecRequestEncodingBase64
	r, err := s.c.api.ExecWithResponse(ctx, s.ID, req)
	if err := s.c.check(r, err); err != nil {
		return nil, err
	}
	res, err := must(r.JSON200)
	if err != nil {
		return nil, err
	}
	out := &ExecResult{ExitStatus: fromAPIExit(res.ExitCode, res.Signal, res.TimedOut, res.Killed, 0),
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		Duration: time.Duration(res.DurationMs * float64(time.Millisecond))}
	if out.Stdout, err = decodeOutput(res.Stdout, res.Encoding); err == nil {
		out.Stderr, err = decodeOutput(res.Stderr, res.Encoding)
	}
	return out, err
}

func decodeOutput(s, encoding string) ([]byte, error) {
	if encoding != "base64" {
		return []byte(s), nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, protocolError("output is not base64: %v", err)
	}
	return b, nil
}

// EventType is the kind of an Event.
type EventType string

// The event types of a stream.
const (
	EventStart  EventType = "start"
	EventOutput EventType = "output"
	EventExit   EventType = "exit"
	EventError  EventType = "error"
)

// Stream names an output stream.
type Stream string

// The output streams.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// Event is one event of a command's stream: its start, a chunk of output,
// its exit, or an error.
type Event struct {
	Type      EventType   `json:"type"`
	ProcessID string      `json:"process_id,omitempty"` // start
	PID       int         `json:"pid,omitempty"`        // start
	Seq       int64       `json:"seq"`                  // output: the chunk's number; exit: the next one's
	Stream    Stream      `json:"stream,omitempty"`     // output
	Data      []byte      `json:"data,omitempty"`       // output
	Exit      *ExitStatus `json:"exit,omitempty"`       // exit
	Err       *Error      `json:"error,omitempty"`      // error
}

func fromAPIEvent(e api.ExecEvent) Event {
	ev := Event{Type: EventType(e.Type), ProcessID: e.ProcessId, PID: e.Pid, Seq: e.Seq,
		Stream: Stream(e.Stream), Data: e.Data}
	switch ev.Type {
	case EventExit:
		st := fromAPIExit(e.ExitCode, e.Signal, e.TimedOut, e.Killed, e.Lost)
		ev.Exit = &st
	case EventError:
		ev.Err = &Error{Code: "internal", Message: "stream failed"}
		if e.Error != nil {
			ev.Err = &Error{Code: e.Error.Code, Message: e.Error.Message, RequestID: e.Error.RequestId}
		}
	}
	return ev
}

// StreamHandler receives a stream's events. Any field may be nil.
type StreamHandler struct {
	Stdout, Stderr io.Writer // output chunks, in order
	// OnEvent sees every event before the writers; an error from it stops
	// the stream and is returned.
	OnEvent func(Event) error
}

func (h StreamHandler) handle(ev Event) error {
	if h.OnEvent != nil {
		if err := h.OnEvent(ev); err != nil {
			return err
		}
	}
	if ev.Type != EventOutput {
		return nil
	}
	w := h.Stdout
	if ev.Stream == Stderr {
		w = h.Stderr
	}
	if w == nil {
		return nil
	}
	_, err := w.Write(ev.Data)
	return err
}

// ExecStream runs cmd and streams its output to h as it comes, returning
// how it ended. Cancelling ctx (or hanging up) kills the command unless it
// runs WithBackground.
func (s *Sandbox) ExecStream(ctx context.Context, cmd string, h StreamHandler, opts ...ExecOption) (*ExitStatus, error) {
	resp, err := s.c.api.ExecStream(ctx, s.ID, newExec(cmd, opts), acceptNDJSON)
	if err := s.c.checkHTTP(resp, err); err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	st, err := readEvents(resp.Body, h)
	if err == nil && st == nil {
		err = protocolError("the stream ended without an exit event")
	}
	return st, err
}

func acceptNDJSON(_ context.Context, r *http.Request) error {
	r.Header.Set("Accept", "application/x-ndjson")
	return nil
}

// readEvents hands NDJSON events to h until the exit (returned), an error
// event, or the end of the body (nil status).
func readEvents(body io.Reader, h StreamHandler) (*ExitStatus, error) {
	dec := json.NewDecoder(body)
	for {
		var e api.ExecEvent
		if err := dec.Decode(&e); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, nil
			}
			return nil, err
		}
		ev := fromAPIEvent(e)
		if err := h.handle(ev); err != nil {
			return nil, err
		}
		switch ev.Type {
		case EventExit:
			return ev.Exit, nil
		case EventError:
			return nil, ev.Err
		}
	}
}
