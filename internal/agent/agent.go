// Package agent is what runs inside every sandbox as PID 1 (after the
// backend's init has built the sandbox): it runs commands with `sh -c` on
// pipes or a PTY, keeps a process table whose output logs are numbered so a
// client can re-attach from any point, reaps every zombie, and serves file
// operations from inside the sandbox, where no path or symlink can lead out.
// It speaks the framed protocol of package proto over a unix socket.
package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/hutch-dev/hutch/internal/agent/proto"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Config is the agent's per-sandbox configuration.
type Config struct {
	// Env is the base environment (KEY=VALUE) of every command.
	Env []string
	// Cwd is the default working directory and the base of relative paths.
	Cwd string
	// Shell runs commands as Shell -c CMD.
	Shell string
	// MaxLog is how many output bytes each process keeps for re-attach.
	MaxLog int
	// KeepFinished is how many finished processes stay in the table.
	KeepFinished int
	// ResetOOMScore gives each command oom_score_adj 0 (init runs lower).
	ResetOOMScore bool
	// ReapAll reaps every child, not only the commands' (true for PID 1).
	ReapAll bool
}

// Server is the agent.
type Server struct {
	cfg      Config
	mu       sync.Mutex // guards the tables; held across fork+register
	procs    map[string]*proc
	byPid    map[int]*proc
	finished []*proc
	nextID   uint64
}

// New makes an agent. Zero fields of cfg get defaults.
func New(cfg Config) *Server {
	cfg.Cwd = orDefault(cfg.Cwd, "/workspace")
	cfg.Shell = orDefault(cfg.Shell, "/bin/sh")
	if cfg.MaxLog == 0 {
		cfg.MaxLog = 8 << 20
	}
	if cfg.KeepFinished == 0 {
		cfg.KeepFinished = 256
	}
	return &Server{cfg: cfg, procs: map[string]*proc{}, byPid: map[int]*proc{}}
}

// Serve accepts connections until ln fails. It also reaps children.
func (s *Server) Serve(ln net.Listener) error {
	sig := make(chan os.Signal, 16)
	signal.Notify(sig, syscall.SIGCHLD)
	defer signal.Stop(sig)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-sig:
				s.reap()
			case <-done:
				return
			}
		}
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go s.handle(proto.NewConn(c))
	}
}

// reap collects exited children and hands each status to its process.
func (s *Server) reap() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.cfg.ReapAll {
		for pid, p := range s.byPid {
			var ws syscall.WaitStatus
			if got, _ := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); got == pid {
				delete(s.byPid, pid)
				p.exitedWith(ws)
			}
		}
		return
	}
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
		if p := s.byPid[pid]; p != nil {
			delete(s.byPid, pid)
			p.exitedWith(ws)
		}
	}
}

// retire moves a done process to the finished list, evicting the oldest.
func (s *Server) retire(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finished = append(s.finished, p)
	for len(s.finished) > s.cfg.KeepFinished {
		delete(s.procs, s.finished[0].id)
		s.finished = s.finished[1:]
	}
}

func (s *Server) lookup(id string) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[id]
	if p == nil {
		return nil, fmt.Errorf("process %q: %w", id, errdefs.ErrNotFound)
	}
	return p, nil
}

func (s *Server) env(req *backend.ExecRequest) []string {
	m := map[string]string{}
	var order []string
	set := func(kv string) {
		k, v, _ := strings.Cut(kv, "=")
		if _, ok := m[k]; !ok {
			order = append(order, k)
		}
		m[k] = v
	}
	for _, kv := range s.cfg.Env {
		set(kv)
	}
	keys := make([]string, 0, len(req.Env))
	for k := range req.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		set(k + "=" + req.Env[k])
	}
	if req.TTY {
		if _, ok := m["TERM"]; !ok {
			set("TERM=xterm-256color")
		}
	}
	env := make([]string, 0, len(order))
	for _, k := range order {
		env = append(env, k+"="+m[k])
	}
	return env
}

// resolve makes p absolute: relative paths are under the default cwd.
func (s *Server) resolve(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path contains a NUL byte: %w", errdefs.ErrInvalidArgument)
	}
	if p == "" {
		return "", fmt.Errorf("empty path: %w", errdefs.ErrInvalidArgument)
	}
	if !path.IsAbs(p) {
		p = path.Join(s.cfg.Cwd, p)
	}
	return path.Clean(p), nil
}

func (s *Server) handle(c *proto.Conn) {
	defer c.Close()
	var req proto.Request
	if err := c.ReadJSON(proto.TRequest, &req); err != nil {
		return
	}
	switch req.Op {
	case proto.OpPing:
		_ = c.WriteJSON(proto.TResponse, proto.Response{})
	case proto.OpExec:
		s.handleExec(c, &req)
	case proto.OpAttach:
		s.handleAttach(c, &req)
	case proto.OpPs:
		_ = c.WriteJSON(proto.TResponse, proto.Response{Processes: s.list()})
	case proto.OpProcess, proto.OpSignal, proto.OpResize:
		s.handleProcess(c, &req)
	case proto.OpRead:
		s.handleRead(c, &req)
	case proto.OpWrite:
		s.handleWrite(c, &req)
	case proto.OpStdin:
		s.handleStdin(c, &req)
	case proto.OpTarGet:
		s.handleTarGet(c, &req)
	case proto.OpTarPut:
		s.handleTarPut(c, &req)
	case proto.OpWatch:
		s.handleWatch(c, &req)
	default:
		s.handleFileOp(c, &req)
	}
}

func (s *Server) list() []backend.ProcessInfo {
	s.mu.Lock()
	ps := make([]*proc, 0, len(s.procs))
	for _, p := range s.procs {
		ps = append(ps, p)
	}
	s.mu.Unlock()
	out := make([]backend.ProcessInfo, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out
}

func (s *Server) handleProcess(c *proto.Conn, req *proto.Request) {
	p, err := s.lookup(req.ProcID)
	switch {
	case err != nil:
	case req.Op == proto.OpSignal:
		err = p.signal(syscall.Signal(req.Signal))
	case req.Op == proto.OpResize:
		err = p.resize(req.Rows, req.Cols)
	}
	if err != nil {
		_ = c.WriteJSON(proto.TResponse, proto.Response{Error: proto.ToWire(err)})
		return
	}
	pi := p.info()
	_ = c.WriteJSON(proto.TResponse, proto.Response{Process: &pi})
}

// handleStdin writes the client's data to a process's stdin, then closes
// it if asked.
func (s *Server) handleStdin(c *proto.Conn, req *proto.Request) {
	p, err := s.lookup(req.ProcID)
	r := &proto.DataReader{C: c}
	if err == nil {
		buf := make([]byte, proto.DataChunk)
		for err == nil {
			n, rerr := r.Read(buf)
			if n > 0 {
				err = p.write(buf[:n])
			}
			if rerr != nil {
				if rerr != io.EOF {
					err = rerr
				}
				break
			}
		}
	}
	if err == nil && req.Close {
		p.closeStdin()
	}
	// Drain what the client still sends, so it reads this answer rather
	// than a broken pipe.
	if err != nil {
		_, _ = io.Copy(io.Discard, r)
	}
	reply(c, proto.Response{}, err)
}

func (s *Server) handleExec(c *proto.Conn, req *proto.Request) {
	if req.Exec == nil {
		_ = c.WriteJSON(proto.TResponse, proto.Response{Error: proto.ToWire(
			fmt.Errorf("exec without a command: %w", errdefs.ErrInvalidArgument))})
		return
	}
	p, err := s.spawn(req.Exec)
	if err != nil {
		_ = c.WriteJSON(proto.TResponse, proto.Response{Error: proto.ToWire(err)})
		return
	}
	delivered := s.stream(c, p, 0)
	switch {
	case !delivered && !p.background:
		p.kill("killed")
	case delivered && !p.background:
		// Its client has every byte; keep the process in the table (ps
		// shows how it ended) but not its output, which init would
		// otherwise hold, charged to the sandbox's memory.
		p.dropLog()
	}
}

func (s *Server) handleAttach(c *proto.Conn, req *proto.Request) {
	p, err := s.lookup(req.ProcID)
	if err != nil {
		_ = c.WriteJSON(proto.TResponse, proto.Response{Error: proto.ToWire(err)})
		return
	}
	s.stream(c, p, req.FromSeq)
}

// stream sends Started, then output from seq on, then the exit. Frames the
// client sends meanwhile go to the process. It reports whether the exit was
// delivered; false means the client went away first.
func (s *Server) stream(c *proto.Conn, p *proc, seq uint64) bool {
	if err := c.WriteJSON(proto.TStarted, proto.Started{ID: p.id, Pid: p.pid}); err != nil {
		return false
	}
	stop := false
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		s.input(c, p)
		p.mu.Lock()
		stop = true
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	delivered := s.sendOutput(c, p, seq, &stop)
	c.Close()
	<-gone
	return delivered
}

func (s *Server) sendOutput(c *proto.Conn, p *proc, seq uint64, stop *bool) bool {
	cursor := seq
	defer p.attach(&cursor)()
	for {
		chunks, done, next := p.next(seq, stop)
		for _, ch := range chunks {
			if err := c.WriteOutput(ch.stream, ch.seq, ch.data); err != nil {
				return false
			}
		}
		seq = next
		p.advance(&cursor, seq)
		if done {
			p.mu.Lock()
			st := p.status
			p.mu.Unlock()
			return c.WriteJSON(proto.TExit, proto.Exit{Seq: next, Status: st}) == nil
		}
		p.mu.Lock()
		stopped := *stop
		p.mu.Unlock()
		if stopped {
			return false
		}
	}
}

// input applies the client's frames (stdin, signals, resizes) until the
// client closes the connection.
func (s *Server) input(c *proto.Conn, p *proc) {
	for {
		t, payload, err := c.ReadFrame()
		if err != nil {
			return
		}
		switch t {
		case proto.TStdin:
			_ = p.write(payload)
		case proto.TStdinClose:
			p.closeStdin()
		case proto.TSignal:
			var sg proto.Signal
			if json.Unmarshal(payload, &sg) == nil {
				_ = p.signal(syscall.Signal(sg.Signal))
			}
		case proto.TResize:
			var rz proto.Resize
			if json.Unmarshal(payload, &rz) == nil {
				_ = p.resize(rz.Rows, rz.Cols)
			}
		}
	}
}

// ServeConn handles one already-accepted connection (for tests).
func (s *Server) ServeConn(rw io.ReadWriteCloser) { s.handle(proto.NewConn(rw)) }
