package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// exec starts a command in a request's (live) sandbox; the sandbox id it
// returns is the one to name in later backend calls.
func (s *Server) exec(r *http.Request, id string, req backend.ExecRequest) (backend.Process, string, error) {
	sid, err := s.live(r, id)
	if err != nil {
		return nil, "", err
	}
	p, err := s.mgr.Backend().Exec(r.Context(), sid, req)
	if err != nil {
		return nil, sid, s.backendErr(r, sid, err)
	}
	return p, sid, nil
}

// execRequest validates an API exec request and turns it into the
// backend's, with its buffered stdin.
func (s *Server) execRequest(req api.ExecRequest) (backend.ExecRequest, []byte, error) {
	if err := s.checkCmd(req.Cmd, req.Env); err != nil {
		return backend.ExecRequest{}, nil, err
	}
	timeout, err := s.timeout(req.Timeout)
	if err != nil {
		return backend.ExecRequest{}, nil, err
	}
	stdin, err := decodeStdin(req.Stdin, string(req.StdinEncoding), s.lim.MaxStdinBytes)
	if err != nil {
		return backend.ExecRequest{}, nil, err
	}
	return backend.ExecRequest{Cmd: req.Cmd, Cwd: req.Cwd, Env: req.Env, Timeout: timeout,
		Stdin: stdin != nil, Background: req.Background, Tag: req.Tag}, stdin, nil
}

func (s *Server) timeout(sec float64) (time.Duration, error) {
	d, err := seconds(sec)
	switch {
	case err != nil:
		return 0, err
	case d == 0:
		return s.lim.DefaultTimeout, nil
	case d > s.lim.MaxTimeout:
		return 0, invalid("timeout %vs is over the maximum of %v", sec, s.lim.MaxTimeout)
	}
	return d, nil
}

// seconds turns a client's seconds into a Duration, refusing what has
// none: negative, NaN, infinite, or past what a Duration holds (the
// conversion would wrap to a negative, i.e. no timeout at all).
func seconds(sec float64) (time.Duration, error) {
	if !(sec >= 0) || sec > float64(math.MaxInt64/int64(time.Second)) {
		return 0, invalid("timeout %v: want seconds ≥ 0 (and fewer than 292 years)", sec)
	}
	return time.Duration(sec * float64(time.Second)), nil
}

func decodeStdin(in, encoding string, max int64) ([]byte, error) {
	if in == "" {
		return nil, nil
	}
	var data []byte
	switch encoding {
	case "", "utf8":
		data = []byte(in)
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(in); err != nil {
			return nil, invalid("stdin is not valid base64: %v", err)
		}
	default:
		return nil, invalid("stdin_encoding %q: want utf8 or base64", encoding)
	}
	if int64(len(data)) > max {
		return nil, errdefs.New(errdefs.ErrTooLarge, "stdin is %d bytes, over the buffered limit of %d; stream it instead", len(data), max)
	}
	return data, nil
}

// Exec implements api.ServerInterface: run to the end, keep capped output.
func (s *Server) Exec(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	start := time.Now()
	var req api.ExecRequest
	if err := decode(w, r, s.lim.MaxBodyBytes+2*s.lim.MaxStdinBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	ereq, stdin, err := s.execRequest(req)
	if err == nil && req.Background {
		err = invalid("background is for streams and processes; a buffered exec waits for its command")
	}
	encoding := string(req.Encoding)
	if err == nil && encoding != "" && encoding != "utf8" && encoding != "base64" {
		err = invalid("encoding %q: want utf8 or base64", encoding)
	}
	keep := req.MaxOutput
	if err == nil && (keep < 0 || keep > s.lim.MaxOutput) {
		err = invalid("max_output %d: want 0 (the default) to %d", keep, s.lim.MaxOutput)
	}
	if keep == 0 {
		keep = s.lim.DefaultOutput
	}
	var res api.ExecResult
	if err == nil {
		res, err = s.runBuffered(r, id, ereq, stdin, keep, encoding)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	res.DurationMs = float64(time.Since(start).Microseconds()) / 1000
	s.metrics.execs.WithLabelValues("buffered").Inc()
	s.metrics.execTime.WithLabelValues("buffered").Observe(time.Since(start).Seconds())
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) runBuffered(r *http.Request, id string, req backend.ExecRequest, stdin []byte, keep int, encoding string) (api.ExecResult, error) {
	p, sid, err := s.exec(r, id, req)
	if err != nil {
		return api.ExecResult{}, err
	}
	defer p.Close()
	stop := context.AfterFunc(r.Context(), func() { p.Close() })
	defer stop()
	if stdin != nil {
		go func() {
			_, _ = p.Write(stdin)
			_ = p.CloseStdin()
		}()
	}
	out, errb := &capped{max: keep}, &capped{max: keep}
	st, err := backend.Wait(p, out, errb)
	if err != nil {
		return api.ExecResult{}, s.backendErr(r, sid, err)
	}
	res := api.ExecResult{ExitCode: exitCode(st), Signal: st.Signal, TimedOut: st.TimedOut, Killed: st.Killed,
		StdoutTruncated: out.truncated, StderrTruncated: errb.truncated, Encoding: "utf8"}
	res.Stdout, res.Stderr = encodeOutput(out.buf, encoding), encodeOutput(errb.buf, encoding)
	if encoding == "base64" {
		res.Encoding = "base64"
	}
	return res, nil
}

func exitCode(st backend.ExitStatus) *int {
	if st.Code < 0 {
		return nil
	}
	c := st.Code
	return &c
}

func encodeOutput(b []byte, encoding string) string {
	if encoding == "base64" {
		return base64.StdEncoding.EncodeToString(b)
	}
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// capped keeps the first max bytes written and notes that more came.
type capped struct {
	buf       []byte
	max       int
	truncated bool
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.max - len(c.buf)
	if room < len(p) {
		c.truncated = true
		p2 := p
		if room > 0 {
			p2 = p[:room]
		} else {
			p2 = nil
		}
		c.buf = append(c.buf, p2...)
		return len(p), nil
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}

// ExecStream implements api.ServerInterface: NDJSON or SSE events. The
// client hanging up aborts the command unless it runs in the background.
func (s *Server) ExecStream(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.ExecRequest
	if err := decode(w, r, s.lim.MaxBodyBytes+2*s.lim.MaxStdinBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	ereq, stdin, err := s.execRequest(req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	p, _, err := s.exec(r, id, ereq)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer p.Close()
	s.metrics.execs.WithLabelValues("stream").Inc()
	if stdin != nil {
		go func() {
			_, _ = p.Write(stdin)
			_ = p.CloseStdin()
		}()
	}
	stop := context.AfterFunc(r.Context(), func() { p.Close() })
	defer stop()
	ew := newEventWriter(w, r)
	_ = ew.write(api.ExecEvent{Type: api.ExecEventTypeStart, ProcessId: p.ID(), Pid: p.Pid()})
	s.pump(p, ew, -1)
}

// pump copies a process's events to ew until the exit, an error, or
// (when until ≥ 0) the output before seq until has been sent.
func (s *Server) pump(p backend.Process, ew *eventWriter, until int64) {
	for {
		ev, err := p.Recv()
		if err == io.EOF {
			return
		}
		if err != nil {
			_, body := s.apiErrorPlain(err)
			_ = ew.write(api.ExecEvent{Type: api.ExecEventTypeError, Error: &body})
			return
		}
		if werr := ew.write(toEvent(ev)); werr != nil || ev.Exit != nil {
			return
		}
		if until >= 0 && int64(ev.Seq)+1 >= until {
			return
		}
	}
}

func (s *Server) apiErrorPlain(err error) (int, api.Error) {
	return errdefs.HTTPStatus(err), api.Error{Code: errdefs.Code(err), Message: err.Error()}
}

func toEvent(ev backend.Event) api.ExecEvent {
	seq := int64(ev.Seq)
	if ev.Exit != nil {
		x := ev.Exit
		return api.ExecEvent{Type: api.ExecEventTypeExit, Seq: seq, ExitCode: exitCode(*x), Signal: x.Signal,
			TimedOut: x.TimedOut, Killed: x.Killed, Lost: int64(x.Lost)}
	}
	stream := api.Stdout
	if ev.Stream == backend.Stderr {
		stream = api.Stderr
	}
	return api.ExecEvent{Type: api.ExecEventTypeOutput, Seq: seq, Stream: stream, Data: ev.Data}
}

// eventWriter writes ExecEvents as NDJSON, or as SSE when the client asked
// for text/event-stream, flushing each.
type eventWriter struct {
	w       http.ResponseWriter
	sse     bool
	started bool
}

func newEventWriter(w http.ResponseWriter, r *http.Request) *eventWriter {
	return &eventWriter{w: w, sse: strings.Contains(r.Header.Get("Accept"), "text/event-stream")}
}

func (e *eventWriter) write(ev api.ExecEvent) error {
	if !e.started {
		e.started = true
		if e.sse {
			e.w.Header().Set("Content-Type", "text/event-stream")
			e.w.Header().Set("Cache-Control", "no-cache")
		} else {
			e.w.Header().Set("Content-Type", "application/x-ndjson")
		}
		e.w.Header().Set("X-Accel-Buffering", "no")
		e.w.WriteHeader(http.StatusOK)
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if e.sse {
		_, err = fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", ev.Type, b)
	} else {
		b = append(b, '\n')
		_, err = e.w.Write(b)
	}
	if err != nil {
		return err
	}
	return http.NewResponseController(e.w).Flush()
}
