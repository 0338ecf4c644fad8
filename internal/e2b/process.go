package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/hutch-dev/hutch/internal/backend"
	processpb "github.com/hutch-dev/hutch/internal/e2b/envdpb/process"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/sandbox"
)

// defaultKeepalive is how often an idle event stream sends a keepalive
// when the client names no interval, so proxies do not cut it.
const defaultKeepalive = 30 * time.Second

// procTable remembers how E2B started each process (executable, args,
// env, cwd), which hutch's process table keeps only as one shell line, so
// that List answers what the client sent.
type procTable struct {
	mu   sync.Mutex
	byID map[string]map[string]*processpb.ProcessConfig // sandbox → hutch proc id → config
}

func newProcTable() *procTable {
	return &procTable{byID: map[string]map[string]*processpb.ProcessConfig{}}
}

func (t *procTable) put(sandboxID, procID string, cfg *processpb.ProcessConfig) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.byID[sandboxID]
	if m == nil {
		m = map[string]*processpb.ProcessConfig{}
		t.byID[sandboxID] = m
	}
	m[procID] = cfg
}

func (t *procTable) get(sandboxID, procID string) *processpb.ProcessConfig {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byID[sandboxID][procID]
}

// prune keeps only the configs of processes still in the sandbox's table.
func (t *procTable) prune(sandboxID string, live map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	maps.DeleteFunc(t.byID[sandboxID], func(id string, _ *processpb.ProcessConfig) bool { return !live[id] })
}

// sandboxes lists the sandboxes the table has entries for.
func (t *procTable) sandboxes() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Collect(maps.Keys(t.byID))
}

func (t *procTable) forget(sandboxID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.byID, sandboxID)
}

// processService is envd's process.Process on hutch's process table.
type processService struct {
	h *Handler
}

func (s *processService) controller() (backend.ProcessController, error) {
	pc, ok := s.h.cfg.Manager.Backend().(backend.ProcessController)
	if !ok {
		return nil, errdefs.New(errdefs.ErrNotImplemented, "the backend has no process table")
	}
	return pc, nil
}

// quote makes s one shell word.
func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellLine turns E2B's executable and arguments into the `sh -c` line
// hutch runs. The SDK runs everything through /bin/bash -l -c; a base
// without bash gets /bin/sh -c with the same command instead of a failure.
func shellLine(cmd string, args []string) string {
	words := make([]string, 0, len(args)+1)
	words = append(words, quote(cmd))
	for _, a := range args {
		words = append(words, quote(a))
	}
	line := "exec " + strings.Join(words, " ")
	if cmd == "/bin/bash" && len(args) == 3 && args[0] == "-l" && args[1] == "-c" {
		return "if [ -x /bin/bash ]; then " + line + "; else exec /bin/sh -c " + quote(args[2]) + "; fi"
	}
	return line
}

// keepaliveOf reads the client's Keepalive-Ping-Interval (seconds).
func keepaliveOf(hdr interface{ Get(string) string }) time.Duration {
	if n, err := strconv.Atoi(hdr.Get("Keepalive-Ping-Interval")); err == nil && n > 0 && n <= 3600 {
		return time.Duration(n) * time.Second
	}
	return defaultKeepalive
}

func (s *processService) Start(ctx context.Context, req *connect.Request[processpb.StartRequest], stream *connect.ServerStream[processpb.StartResponse]) error {
	id, err := sandboxID(ctx)
	if err != nil {
		return s.h.rpcError(err)
	}
	m := req.Msg
	cfg := m.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	if err := checkEnv(cfg.GetEnvs()); err != nil {
		return s.h.rpcError(err)
	}
	if c := cfg.GetCwd(); c != "" && (!path.IsAbs(c) || strings.IndexByte(c, 0) >= 0) {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd %q: want an absolute path without NUL bytes", c))
	}
	er := backend.ExecRequest{Cmd: shellLine(cfg.GetCmd(), cfg.GetArgs()), Env: cfg.GetEnvs(), Cwd: cfg.GetCwd(),
		Stdin: m.GetStdin(), Tag: m.GetTag(),
		// envd processes outlive their stream: the SDK disconnects and
		// reconnects by pid.
		Background: true}
	if m.Pty != nil {
		er.TTY, er.Stdin = true, true
		er.Rows, er.Cols = clampSize(m.Pty.GetSize().GetRows()), clampSize(m.Pty.GetSize().GetCols())
	}
	if dl, ok := ctx.Deadline(); ok {
		// The client's deadline is the command's timeout (the SDK's
		// timeoutMs): the agent kills the process group when it passes.
		er.Timeout = max(time.Until(dl), time.Millisecond)
	}
	p, err := s.h.cfg.Manager.Backend().Exec(context.WithoutCancel(ctx), id, er)
	if err != nil {
		return s.h.rpcError(s.h.cfg.Manager.CheckAlive(ctx, id, err))
	}
	s.h.procs.put(id, p.ID(), cfg)
	s.h.sweep(ctx)
	send := func(ev *processpb.ProcessEvent) error {
		return stream.Send(&processpb.StartResponse{Event: ev})
	}
	return s.pump(ctx, p, m.Pty != nil, keepaliveOf(req.Header()), send)
}

func clampSize(n uint32) uint16 {
	return uint16(min(n, 1000))
}

// pump sends a process's start, output and end as envd events, with
// keepalives while it is quiet. When the client's deadline passes, the
// process is killed and the client gets DeadlineExceeded (the SDK's
// TimeoutError); when the client merely goes away, the process runs on.
func (s *processService) pump(ctx context.Context, p backend.Process, pty bool, keepalive time.Duration, send func(*processpb.ProcessEvent) error) error {
	defer p.Close()
	if err := send(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Start{Start: &processpb.ProcessEvent_StartEvent{Pid: uint32(p.Pid())}}}); err != nil {
		return err
	}
	// One channel for events and the final error keeps their order: the
	// end event is always sent before the stream ends.
	type item struct {
		ev  backend.Event
		err error
	}
	events := make(chan item, 16)
	done := make(chan struct{})
	defer close(done)
	go func() { // owned by pump: it ends when p is closed (deferred above)
		for {
			ev, err := p.Recv()
			select {
			case events <- item{ev, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				_ = p.Signal(context.WithoutCancel(ctx), syscall.SIGKILL)
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the command's timeout passed; it was killed"))
			}
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		case <-tick.C:
			if err := send(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Keepalive{Keepalive: &processpb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case it := <-events:
			ev, err := it.ev, it.err
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return s.h.rpcError(err)
			}
			if ev.Exit != nil {
				return send(endEvent(*ev.Exit))
			}
			if err := send(dataEvent(ev, pty)); err != nil {
				return err
			}
		}
	}
}

func dataEvent(ev backend.Event, pty bool) *processpb.ProcessEvent {
	d := &processpb.ProcessEvent_DataEvent{}
	switch {
	case pty:
		d.Output = &processpb.ProcessEvent_DataEvent_Pty{Pty: ev.Data}
	case ev.Stream == backend.Stderr:
		d.Output = &processpb.ProcessEvent_DataEvent_Stderr{Stderr: ev.Data}
	default:
		d.Output = &processpb.ProcessEvent_DataEvent_Stdout{Stdout: ev.Data}
	}
	return &processpb.ProcessEvent{Event: &processpb.ProcessEvent_Data{Data: d}}
}

// endEvent describes an exit as envd does: a code and "exit status N", or
// -1 and the signal when the process was killed.
func endEvent(x backend.ExitStatus) *processpb.ProcessEvent {
	e := &processpb.ProcessEvent_EndEvent{ExitCode: int32(x.Code), Exited: x.Code >= 0, Status: fmt.Sprintf("exit status %d", x.Code)}
	if x.Code < 0 {
		e.Status = "signal: " + strings.TrimPrefix(strings.ToLower(x.Signal), "sig")
	}
	switch {
	case x.TimedOut:
		msg := "the command timed out and was killed"
		e.Error = &msg
	case x.Code != 0:
		e.Error = &e.Status
	}
	return &processpb.ProcessEvent{Event: &processpb.ProcessEvent_End{End: e}}
}

// resolve finds the hutch process a selector names: by in-sandbox pid or by
// tag. Finished processes are not found, as in envd.
func (s *processService) resolve(ctx context.Context, id string, sel *processpb.ProcessSelector) (backend.ProcessInfo, error) {
	pc, err := s.controller()
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	ps, err := pc.Processes(ctx, id)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	for _, p := range ps {
		if p.Exit != nil {
			continue
		}
		switch v := sel.GetSelector().(type) {
		case *processpb.ProcessSelector_Pid:
			if uint32(p.Pid) == v.Pid {
				return p, nil
			}
		case *processpb.ProcessSelector_Tag:
			if p.Tag != "" && p.Tag == v.Tag {
				return p, nil
			}
		}
	}
	switch v := sel.GetSelector().(type) {
	case *processpb.ProcessSelector_Pid:
		return backend.ProcessInfo{}, errdefs.New(errdefs.ErrNotFound, "process with pid %d", v.Pid)
	case *processpb.ProcessSelector_Tag:
		return backend.ProcessInfo{}, errdefs.New(errdefs.ErrNotFound, "process with tag %q", v.Tag)
	}
	return backend.ProcessInfo{}, errdefs.New(errdefs.ErrInvalidArgument, "a process selector needs a pid or a tag")
}

func (s *processService) Connect(ctx context.Context, req *connect.Request[processpb.ConnectRequest], stream *connect.ServerStream[processpb.ConnectResponse]) error {
	id, err := sandboxID(ctx)
	if err != nil {
		return s.h.rpcError(err)
	}
	info, err := s.resolve(ctx, id, req.Msg.GetProcess())
	if err != nil {
		return s.h.rpcError(err)
	}
	pc, _ := s.controller()
	// From the next sequence number: like envd, a connection sees output
	// from now on.
	p, err := pc.Attach(ctx, id, info.ID, info.NextSeq)
	if err != nil {
		return s.h.rpcError(err)
	}
	send := func(ev *processpb.ProcessEvent) error {
		return stream.Send(&processpb.ConnectResponse{Event: ev})
	}
	return s.pumpAttached(ctx, p, info.TTY, keepaliveOf(req.Header()), send)
}

// pumpAttached is pump for an attached stream: a deadline on it ends the
// connection, never the process.
func (s *processService) pumpAttached(ctx context.Context, p backend.Process, pty bool, keepalive time.Duration, send func(*processpb.ProcessEvent) error) error {
	err := s.pump(context.WithoutCancel(ctx), &ctxProcess{Process: p, ctx: ctx}, pty, keepalive, send)
	if ctx.Err() != nil {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return err
}

// ctxProcess ends Recv with the context's error once ctx is done, so an
// attached stream stops at its client's deadline without a kill.
type ctxProcess struct {
	backend.Process
	ctx  context.Context
	once sync.Once
}

func (c *ctxProcess) Recv() (backend.Event, error) {
	c.once.Do(func() { context.AfterFunc(c.ctx, func() { _ = c.Process.Close() }) })
	ev, err := c.Process.Recv()
	if err != nil && c.ctx.Err() != nil {
		return ev, io.EOF
	}
	return ev, err
}

func (s *processService) List(ctx context.Context, _ *connect.Request[processpb.ListRequest]) (*connect.Response[processpb.ListResponse], error) {
	id, err := sandboxID(ctx)
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	pc, err := s.controller()
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	ps, err := pc.Processes(ctx, id)
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	out := &processpb.ListResponse{}
	live := map[string]bool{}
	for _, p := range ps {
		live[p.ID] = true
		if p.Exit != nil {
			continue
		}
		cfg := s.h.procs.get(id, p.ID)
		if cfg == nil {
			cfg = &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", p.Cmd}}
		}
		info := &processpb.ProcessInfo{Config: cfg, Pid: uint32(p.Pid)}
		if p.Tag != "" {
			info.Tag = &p.Tag
		}
		out.Processes = append(out.Processes, info)
	}
	s.h.procs.prune(id, live)
	return connect.NewResponse(out), nil
}

func (s *processService) input(ctx context.Context, sel *processpb.ProcessSelector, in *processpb.ProcessInput, closeStdin bool) error {
	id, err := sandboxID(ctx)
	if err != nil {
		return err
	}
	info, err := s.resolve(ctx, id, sel)
	if err != nil {
		return err
	}
	pc, _ := s.controller()
	var data []byte
	switch v := in.GetInput().(type) {
	case *processpb.ProcessInput_Stdin:
		data = v.Stdin
	case *processpb.ProcessInput_Pty:
		data = v.Pty
	}
	return pc.WriteStdin(ctx, id, info.ID, strings.NewReader(string(data)), closeStdin)
}

func (s *processService) SendInput(ctx context.Context, req *connect.Request[processpb.SendInputRequest]) (*connect.Response[processpb.SendInputResponse], error) {
	if err := s.input(ctx, req.Msg.GetProcess(), req.Msg.GetInput(), false); err != nil {
		return nil, s.h.rpcError(err)
	}
	return connect.NewResponse(&processpb.SendInputResponse{}), nil
}

func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[processpb.CloseStdinRequest]) (*connect.Response[processpb.CloseStdinResponse], error) {
	if err := s.input(ctx, req.Msg.GetProcess(), nil, true); err != nil {
		return nil, s.h.rpcError(err)
	}
	return connect.NewResponse(&processpb.CloseStdinResponse{}), nil
}

// StreamInput takes a start event naming the process, then input events.
func (s *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[processpb.StreamInputRequest]) (*connect.Response[processpb.StreamInputResponse], error) {
	var sel *processpb.ProcessSelector
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *processpb.StreamInputRequest_Start:
			sel = ev.Start.GetProcess()
		case *processpb.StreamInputRequest_Data:
			if sel == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input before the start event"))
			}
			if err := s.input(ctx, sel, ev.Data.GetInput(), false); err != nil {
				return nil, s.h.rpcError(err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&processpb.StreamInputResponse{}), nil
}

func (s *processService) SendSignal(ctx context.Context, req *connect.Request[processpb.SendSignalRequest]) (*connect.Response[processpb.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case processpb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case processpb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v: want SIGTERM or SIGKILL", req.Msg.GetSignal()))
	}
	id, err := sandboxID(ctx)
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	info, err := s.resolve(ctx, id, req.Msg.GetProcess())
	if err == nil {
		pc, _ := s.controller()
		err = pc.SignalProcess(ctx, id, info.ID, sig)
	}
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	return connect.NewResponse(&processpb.SendSignalResponse{}), nil
}

// Update resizes a process's terminal.
func (s *processService) Update(ctx context.Context, req *connect.Request[processpb.UpdateRequest]) (*connect.Response[processpb.UpdateResponse], error) {
	id, err := sandboxID(ctx)
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	info, err := s.resolve(ctx, id, req.Msg.GetProcess())
	if err != nil {
		return nil, s.h.rpcError(err)
	}
	if req.Msg.Pty == nil {
		return connect.NewResponse(&processpb.UpdateResponse{}), nil
	}
	if !info.TTY {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal", info.Pid))
	}
	size := req.Msg.Pty.GetSize()
	rows, cols := clampSize(size.GetRows()), clampSize(size.GetCols())
	pc, _ := s.controller()
	// In effect on return (where the backend can), so input sent after it
	// sees the new size.
	if err := backend.ResizeProcess(ctx, s.h.cfg.Manager.Backend(), pc, id, info.ID, rows, cols); err != nil {
		return nil, s.h.rpcError(err)
	}
	return connect.NewResponse(&processpb.UpdateResponse{}), nil
}

// checkEnv refuses what no process environment can hold.
func checkEnv(env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return errdefs.New(errdefs.ErrInvalidArgument, "env %q: a name must be non-empty without '=' or NUL, a value without NUL", k)
		}
	}
	return nil
}

// sweepAbove is how many sandboxes the per-sandbox tables may name before
// a sweep drops those that are gone: sandboxes also end by timeout or
// through hutch's own API, which this package does not see.
var sweepAbove = 256

// sweepEvery spaces sweeps.
var sweepEvery = time.Minute

// sweep forgets the process configs and polling watchers of sandboxes that
// no longer run, once the tables have grown past sweepAbove.
// At most one sweep a minute: with many live sandboxes the tables stay
// large, and a sweep reads each one's record.
func (h *Handler) sweep(ctx context.Context) {
	ids := h.procs.sandboxes()
	ids = append(ids, h.watch.sandboxes()...)
	if len(ids) <= sweepAbove {
		return
	}
	h.sweepMu.Lock()
	due := time.Since(h.swept) >= sweepEvery
	if due {
		h.swept = time.Now()
	}
	h.sweepMu.Unlock()
	if !due {
		return
	}
	for _, id := range ids {
		sb, err := h.cfg.Manager.Get(ctx, "", id)
		if errdefs.Code(err) == "not_found" || (err == nil && (sb.State == sandbox.Destroyed || sb.State == sandbox.Failed)) {
			h.procs.forget(id)
			h.watch.forget(id)
		}
	}
}
