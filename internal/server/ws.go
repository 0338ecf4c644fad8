package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"github.com/coder/websocket"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/backend"
)

// wsWriter sends ExecEvents as JSON text frames.
type wsWriter struct {
	ctx context.Context
	c   *websocket.Conn
}

func (w wsWriter) event(ev api.ExecEvent) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return w.c.Write(w.ctx, websocket.MessageText, b)
}

// ExecWebSocket implements api.ServerInterface: the first client message
// is an ExecRequest; then StreamInput messages go in and ExecEvents out.
func (s *Server) ExecWebSocket(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	sid, err := s.live(r, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept has answered the client
	}
	defer c.CloseNow()
	c.SetReadLimit(s.lim.MaxBodyBytes + 2*s.lim.MaxStdinBytes)
	ctx := r.Context()
	ww := wsWriter{ctx: ctx, c: c}
	p, stdin, err := s.startFromWS(ctx, c, sid)
	if err != nil {
		_, body := s.apiErrorPlain(err)
		_ = ww.event(api.ExecEvent{Type: api.ExecEventTypeError, Error: &body})
		_ = c.Close(websocket.StatusPolicyViolation, body.Code)
		return
	}
	defer p.Close()
	s.metrics.execs.WithLabelValues("websocket").Inc()
	_ = ww.event(api.ExecEvent{Type: api.ExecEventTypeStart, ProcessId: p.ID(), Pid: p.Pid()})
	go s.wsInput(ctx, c, p, stdin)
	for {
		ev, err := p.Recv()
		if err != nil {
			break
		}
		if ww.event(toEvent(ev)) != nil || ev.Exit != nil {
			break
		}
	}
	_ = c.Close(websocket.StatusNormalClosure, "")
}

// startFromWS starts the command of the first message; its buffered
// stdin, if any, is returned to be written ahead of later input.
func (s *Server) startFromWS(ctx context.Context, c *websocket.Conn, sid string) (backend.Process, []byte, error) {
	_, msg, err := c.Read(ctx)
	if err != nil {
		return nil, nil, invalid("websocket: the first message must be an ExecRequest: %v", err)
	}
	var req api.ExecRequest
	dec := json.NewDecoder(bytes.NewReader(msg))
	dec.DisallowUnknownFields() // as for the same request over HTTP
	if err := dec.Decode(&req); err != nil {
		return nil, nil, invalid("websocket: the first message is not an ExecRequest: %v", err)
	}
	ereq, stdin, err := s.execRequest(req)
	if err != nil {
		return nil, nil, err
	}
	ereq.Stdin = true
	p, err := s.mgr.Backend().Exec(ctx, sid, ereq)
	return p, stdin, err
}

// wsInput writes first to p, then applies StreamInput messages (and, for
// terminals, raw binary keystrokes) until the client goes away. It runs
// beside the output pump, so a command that does not read cannot block
// the output.
func (s *Server) wsInput(ctx context.Context, c *websocket.Conn, p backend.Process, first []byte) {
	defer p.Close()
	if len(first) > 0 {
		_, _ = p.Write(first)
	}
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			_, _ = p.Write(msg)
			continue
		}
		var in api.StreamInput
		if json.Unmarshal(msg, &in) != nil {
			continue
		}
		applyInput(ctx, p, in)
	}
}

func applyInput(ctx context.Context, p backend.Process, in api.StreamInput) {
	switch in.Type {
	case api.Stdin:
		_, _ = p.Write(in.Data)
	case api.StdinClose:
		_ = p.CloseStdin()
	case api.Signal:
		if sig, err := parseSignal(in.Signal); err == nil {
			_ = p.Signal(ctx, sig)
		}
	case api.Resize:
		if in.Rows > 0 && in.Cols > 0 {
			_ = p.Resize(ctx, uint16(in.Rows), uint16(in.Cols))
		}
	}
}
