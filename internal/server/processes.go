package server

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/coder/websocket"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

func (s *Server) procs() (backend.ProcessController, error) {
	pc, ok := s.mgr.Backend().(backend.ProcessController)
	if !ok {
		return nil, errdefs.New(errdefs.ErrNotImplemented, "backend %s has no process table", s.mgr.Backend().Name())
	}
	return pc, nil
}

// resolveProcess finds a process by id or, failing that, by tag (the
// newest process carrying it).
func (s *Server) resolveProcess(r *http.Request, id, proc string) (string, backend.ProcessController, error) {
	sid, err := s.live(r, id)
	if err != nil {
		return "", nil, err
	}
	pc, err := s.procs()
	if err != nil {
		return "", nil, err
	}
	if _, err := pc.ProcessInfo(r.Context(), sid, proc); err == nil {
		return proc, pc, nil
	} else if errdefs.Code(err) != "not_found" {
		return "", nil, s.backendErr(r, sid, err)
	}
	ps, err := pc.Processes(r.Context(), sid)
	if err != nil {
		return "", nil, s.backendErr(r, sid, err)
	}
	for i := len(ps) - 1; i >= 0; i-- {
		if ps[i].Tag == proc {
			return ps[i].ID, pc, nil
		}
	}
	return "", nil, notFound("process %q in sandbox %s", proc, id)
}

func toAPIProcess(pi backend.ProcessInfo) api.Process {
	out := api.Process{Id: pi.ID, Pid: pi.Pid, Cmd: pi.Cmd, Tag: pi.Tag, Tty: pi.TTY, StartedAt: pi.Started,
		NextSeq: int64(pi.NextSeq), Running: pi.Exit == nil}
	if pi.Exit != nil {
		out.Exit = &api.ExitStatus{ExitCode: exitCode(*pi.Exit), Signal: pi.Exit.Signal, TimedOut: pi.Exit.TimedOut,
			Killed: pi.Exit.Killed, Lost: int64(pi.Exit.Lost)}
	}
	return out
}

// StartProcess implements api.ServerInterface.
func (s *Server) StartProcess(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.StartProcessRequest
	if err := decode(w, r, s.lim.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Rows < 0 || req.Cols < 0 || req.Rows > 1000 || req.Cols > 1000 {
		s.fail(w, r, invalid("terminal size %dx%d: want 1-1000 each (0: the default)", req.Rows, req.Cols))
		return
	}
	ereq := backend.ExecRequest{Cmd: req.Cmd, Cwd: req.Cwd, Env: req.Env, Tag: req.Tag, Stdin: req.Stdin,
		TTY: req.Tty, Rows: uint16(req.Rows), Cols: uint16(req.Cols), Background: true}
	s.startDetached(w, r, id, ereq, req.Timeout)
}

// startDetached starts a background process and answers with it.
func (s *Server) startDetached(w http.ResponseWriter, r *http.Request, id string, ereq backend.ExecRequest, timeout float64) {
	if err := s.checkCmd(ereq.Cmd, ereq.Env); err != nil {
		s.fail(w, r, err)
		return
	}
	var err error
	if ereq.Timeout, err = seconds(timeout); err != nil {
		s.fail(w, r, err)
		return
	}
	p, sid, err := s.exec(r, id, ereq)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	p.Close() // detach: a background process runs on
	s.metrics.execs.WithLabelValues("process").Inc()
	pc, err := s.procs()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	pi, err := pc.ProcessInfo(r.Context(), sid, p.ID())
	if err != nil {
		s.fail(w, r, s.backendErr(r, sid, err))
		return
	}
	writeJSON(w, http.StatusCreated, toAPIProcess(pi))
}

// checkCmd refuses what no process can be started with: an empty or
// oversized command, and NUL bytes, which execve cannot pass.
func (s *Server) checkCmd(cmd string, env map[string]string) error {
	if cmd == "" {
		return invalid("cmd is empty")
	}
	if len(cmd) > s.lim.MaxCmdBytes {
		return errdefs.New(errdefs.ErrTooLarge, "cmd is %d bytes, over the limit of %d", len(cmd), s.lim.MaxCmdBytes)
	}
	if strings.IndexByte(cmd, 0) >= 0 {
		return invalid("cmd contains a NUL byte")
	}
	return checkEnv(env)
}

// checkEnv refuses variables execve cannot pass or that would set another
// variable than the one named (a key with '=').
func checkEnv(env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return invalid("env %q: a name must be non-empty without '=' or NUL, a value without NUL", k)
		}
	}
	return nil
}

// ListProcesses implements api.ServerInterface.
func (s *Server) ListProcesses(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	sid, err := s.live(r, id)
	var pc backend.ProcessController
	if err == nil {
		pc, err = s.procs()
	}
	var ps []backend.ProcessInfo
	if err == nil {
		ps, err = pc.Processes(r.Context(), sid)
		err = s.maybeBackendErr(r, sid, err)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := api.ProcessList{Processes: make([]api.Process, 0, len(ps))}
	for _, pi := range ps {
		out.Processes = append(out.Processes, toAPIProcess(pi))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) maybeBackendErr(r *http.Request, sid string, err error) error {
	if err == nil {
		return nil
	}
	return s.backendErr(r, sid, err)
}

// GetProcess implements api.ServerInterface.
func (s *Server) GetProcess(w http.ResponseWriter, r *http.Request, id api.SandboxID, process api.ProcessID) {
	pid, pc, err := s.resolveProcess(r, id, process)
	var pi backend.ProcessInfo
	if err == nil {
		pi, err = pc.ProcessInfo(r.Context(), id, pid)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPIProcess(pi))
}

// ProcessOutput implements api.ServerInterface.
func (s *Server) ProcessOutput(w http.ResponseWriter, r *http.Request, id api.SandboxID, process api.ProcessID, params api.ProcessOutputParams) {
	if params.FromSeq < 0 {
		s.fail(w, r, invalid("from_seq %d: want ≥ 0", params.FromSeq))
		return
	}
	pid, pc, err := s.resolveProcess(r, id, process)
	var pi backend.ProcessInfo
	if err == nil {
		pi, err = pc.ProcessInfo(r.Context(), id, pid)
	}
	var p backend.Process
	if err == nil {
		p, err = pc.Attach(r.Context(), id, pid, uint64(params.FromSeq))
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer p.Close()
	stop := context.AfterFunc(r.Context(), func() { p.Close() })
	defer stop()
	until := int64(-1)
	if !params.Follow && pi.Exit == nil {
		until = int64(pi.NextSeq) // what is there now, and no more
	}
	ew := newEventWriter(w, r)
	if until >= 0 && until <= params.FromSeq {
		_ = ew.write(api.ExecEvent{Type: api.ExecEventTypeStart, ProcessId: pid, Pid: pi.Pid})
		return
	}
	_ = ew.write(api.ExecEvent{Type: api.ExecEventTypeStart, ProcessId: pid, Pid: pi.Pid})
	s.pump(p, ew, until)
}

// WriteProcessStdin implements api.ServerInterface.
func (s *Server) WriteProcessStdin(w http.ResponseWriter, r *http.Request, id api.SandboxID, process api.ProcessID, params api.WriteProcessStdinParams) {
	pid, pc, err := s.resolveProcess(r, id, process)
	if err == nil {
		err = pc.WriteStdin(r.Context(), id, pid, r.Body, params.Close)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// SignalProcess implements api.ServerInterface.
func (s *Server) SignalProcess(w http.ResponseWriter, r *http.Request, id api.SandboxID, process api.ProcessID) {
	var req api.SignalRequest
	if err := decode(w, r, s.lim.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sig, err := parseSignal(req.Signal)
	var pid string
	var pc backend.ProcessController
	if err == nil {
		pid, pc, err = s.resolveProcess(r, id, process)
	}
	if err == nil {
		err = pc.SignalProcess(r.Context(), id, pid, sig)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// parseSignal reads "SIGTERM", "TERM", "term" or "15".
func parseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, invalid("signal %d: want 1-64", n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, invalid("signal %q: unknown", s)
}

// WaitProcess implements api.ServerInterface.
func (s *Server) WaitProcess(w http.ResponseWriter, r *http.Request, id api.SandboxID, process api.ProcessID, params api.WaitProcessParams) {
	timeout, err := s.waitTimeout(params.Timeout)
	var pid string
	var pc backend.ProcessController
	if err == nil {
		pid, pc, err = s.resolveProcess(r, id, process)
	}
	var pi backend.ProcessInfo
	if err == nil {
		pi, err = s.waitExit(r.Context(), pc, id, pid, timeout)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPIProcess(pi))
}

func (s *Server) waitTimeout(secp *float64) (time.Duration, error) {
	if secp == nil {
		return s.lim.DefaultTimeout, nil
	}
	sec := *secp
	if sec == 0 {
		return s.lim.DefaultTimeout, nil
	}
	return s.timeout(sec)
}

// waitExit follows a process (skipping its output) until it exits.
func (s *Server) waitExit(ctx context.Context, pc backend.ProcessController, id, pid string, timeout time.Duration) (backend.ProcessInfo, error) {
	pi, err := pc.ProcessInfo(ctx, id, pid)
	if err != nil || pi.Exit != nil {
		return pi, err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p, err := pc.Attach(wctx, id, pid, pi.NextSeq)
	if err != nil {
		return pi, err
	}
	defer p.Close()
	stop := context.AfterFunc(wctx, func() { p.Close() })
	defer stop()
	for {
		ev, err := p.Recv()
		if err != nil {
			if wctx.Err() != nil && ctx.Err() == nil {
				return pi, errdefs.New(errdefs.ErrDeadlineExceeded, "process %s still runs after %v", pid, timeout)
			}
			return pi, err
		}
		if ev.Exit != nil {
			return pc.ProcessInfo(ctx, id, pid)
		}
	}
}

// OpenTerminal implements api.ServerInterface.
func (s *Server) OpenTerminal(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.OpenTerminalRequest
	if err := decode(w, r, s.lim.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	cmd := req.Cmd
	if cmd == "" {
		cmd = "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"
	}
	rows, cols := req.Rows, req.Cols
	if rows <= 0 || cols <= 0 {
		rows, cols = 24, 80
	}
	if rows > 1000 || cols > 1000 {
		s.fail(w, r, invalid("terminal size %dx%d: at most 1000x1000", rows, cols))
		return
	}
	s.startDetached(w, r, id, backend.ExecRequest{Cmd: cmd, Cwd: req.Cwd, Env: req.Env, Tag: req.Tag,
		TTY: true, Stdin: true, Rows: uint16(rows), Cols: uint16(cols), Background: true}, 0)
}

// ResizeTerminal implements api.ServerInterface.
func (s *Server) ResizeTerminal(w http.ResponseWriter, r *http.Request, id api.SandboxID, process api.ProcessID) {
	var req api.ResizeRequest
	if err := decode(w, r, s.lim.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Rows < 1 || req.Cols < 1 || req.Rows > 1000 || req.Cols > 1000 {
		s.fail(w, r, invalid("terminal size %dx%d: want 1-1000 each", req.Rows, req.Cols))
		return
	}
	pid, pc, err := s.resolveProcess(r, id, process)
	if err == nil {
		err = backend.ResizeProcess(r.Context(), s.mgr.Backend(), pc, id, pid, uint16(req.Rows), uint16(req.Cols))
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// TerminalWebSocket implements api.ServerInterface: replay up to
// scrollback bytes, then live output as binary frames; keystrokes in as
// binary frames, resizes as StreamInput text frames. Closing the socket
// detaches; the terminal runs on.
func (s *Server) TerminalWebSocket(w http.ResponseWriter, r *http.Request, id api.SandboxID, process api.ProcessID, params api.TerminalWebSocketParams) {
	scrollback := 64 << 10
	if params.Scrollback != nil {
		scrollback = *params.Scrollback
	}
	if scrollback < 0 {
		s.fail(w, r, invalid("scrollback %d: want ≥ 0", scrollback))
		return
	}
	pid, pc, err := s.resolveProcess(r, id, process)
	var pi backend.ProcessInfo
	if err == nil {
		pi, err = pc.ProcessInfo(r.Context(), id, pid)
	}
	if err == nil && !pi.TTY {
		err = errdefs.New(errdefs.ErrFailedPrecondition, "process %s has no terminal", pid)
	}
	var p backend.Process
	if err == nil {
		p, err = pc.Attach(r.Context(), id, pid, 0)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer p.Close()
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx := r.Context()
	s.terminalSession(ctx, c, p, pi, scrollback)
}

func (s *Server) terminalSession(ctx context.Context, c *websocket.Conn, p backend.Process, pi backend.ProcessInfo, scrollback int) {
	ww := wsWriter{ctx: ctx, c: c}
	_ = ww.event(api.ExecEvent{Type: api.ExecEventTypeStart, ProcessId: pi.ID, Pid: pi.Pid})
	var replay bytes.Buffer
	caughtUp := pi.NextSeq == 0
	go s.wsInput(ctx, c, p, nil)
	for {
		ev, err := p.Recv()
		if err != nil {
			break
		}
		if ev.Exit != nil {
			if replay.Len() > 0 {
				_ = c.Write(ctx, websocket.MessageBinary, tail(replay.Bytes(), scrollback))
			}
			_ = ww.event(toEvent(ev))
			break
		}
		if !caughtUp {
			replay.Write(ev.Data)
			if ev.Seq+1 < pi.NextSeq {
				continue
			}
			caughtUp = true
			ev.Data = tail(replay.Bytes(), scrollback)
			replay.Reset()
			if len(ev.Data) == 0 {
				continue
			}
		}
		if c.Write(ctx, websocket.MessageBinary, ev.Data) != nil {
			break
		}
	}
	_ = c.Close(websocket.StatusNormalClosure, "")
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
