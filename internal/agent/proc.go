package agent

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// drainGrace is how long output is still read after a process exits, for
// data a background grandchild keeps writing to the inherited pipe.
const drainGrace = 50 * time.Millisecond

type chunk struct {
	seq    uint64
	stream backend.Stream
	data   []byte
}

// proc is one command in the process table. Its output is kept as a log of
// chunks, numbered from 0, so any client can (re)attach from any point that
// is still retained.
type proc struct {
	s          *Server
	id         string
	cmd        string
	tag        string
	tty        bool
	background bool
	pid        int
	started    time.Time

	stdin   *os.File // pipe write end or PTY master; nil when closed
	master  *os.File // PTY master, for resize
	outputs []*os.File
	readers sync.WaitGroup
	timer   *time.Timer

	mu       sync.Mutex
	cond     *sync.Cond
	chunks   []chunk
	nextSeq  uint64
	logBytes int
	lost     uint64
	// cursors are the next seqs of attached streams. The log never drops
	// a chunk an attached stream has yet to send: the reader waits, and the
	// process blocks on its pipe, as it would on a slow terminal.
	cursors map[*uint64]struct{}
	reason  string // "timeout" or "killed": why we signalled it
	exited  bool
	done    bool // exited and output drained: status is final
	status  backend.ExitStatus
}

func (p *proc) info() backend.ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	pi := backend.ProcessInfo{ID: p.id, Pid: p.pid, Cmd: p.cmd, Tag: p.tag, TTY: p.tty,
		Started: p.started, NextSeq: p.nextSeq}
	if p.done {
		st := p.status
		pi.Exit = &st
	}
	return pi
}

// spawn starts req with sh -c, on pipes or a PTY.
func (s *Server) spawn(req *backend.ExecRequest) (*proc, error) {
	if req.Cmd == "" {
		return nil, fmt.Errorf("empty command: %w", errdefs.ErrInvalidArgument)
	}
	cwd, err := s.resolve(orDefault(req.Cwd, s.cfg.Cwd))
	if err != nil {
		return nil, err
	}
	p := &proc{s: s, cmd: req.Cmd, tag: req.Tag, tty: req.TTY, background: req.Background, started: time.Now()}
	p.cond = sync.NewCond(&p.mu)
	files, closeAfter, err := p.openStdio(req)
	if err != nil {
		return nil, err
	}
	defer closeAll(closeAfter)
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   s.env(req),
		Files: files,
		Sys:   &syscall.SysProcAttr{Setpgid: !req.TTY, Setsid: req.TTY, Setctty: req.TTY},
	}
	if err := s.forkRegister(p, attr); err != nil {
		p.closeFiles()
		return nil, err
	}
	p.startReaders()
	if req.Timeout > 0 {
		p.timer = time.AfterFunc(req.Timeout, func() { p.kill("timeout") })
	}
	return p, nil
}

// forkRegister forks the child and enters it in the table under the reaper's
// lock, so the reaper can never collect a status for a pid it does not know.
func (s *Server) forkRegister(p *proc, attr *syscall.ProcAttr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	pid, err := syscall.ForkExec(s.cfg.Shell, []string{"sh", "-c", p.cmd}, attr)
	if err != nil {
		return startError(err, attr.Dir, s.cfg.Shell)
	}
	p.pid = pid
	s.nextID++
	p.id = strconv.FormatUint(s.nextID, 10)
	s.procs[p.id] = p
	s.byPid[pid] = p
	if s.cfg.ResetOOMScore {
		// init runs with a low oom_score_adj that children inherit; give
		// the command the default back so an OOM kill picks it, not init.
		_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte("0"), 0)
	}
	return nil
}

func startError(err error, dir, shell string) error {
	if errors.Is(err, syscall.ENOENT) {
		if _, serr := os.Stat(dir); serr != nil {
			return fmt.Errorf("working directory %s: %w", dir, errdefs.ErrNotFound)
		}
		return fmt.Errorf("%s: %w", shell, errdefs.ErrFailedPrecondition)
	}
	if errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("working directory %s is not a directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	if errors.Is(err, syscall.EAGAIN) {
		return fmt.Errorf("fork: %v: %w", err, errdefs.ErrResourceExhausted)
	}
	return fmt.Errorf("start: %w", err)
}

// openStdio makes the child's stdin, stdout and stderr. It returns the fds
// for the child and the files to close in the parent after the fork.
func (p *proc) openStdio(req *backend.ExecRequest) ([]uintptr, []*os.File, error) {
	if req.TTY {
		return p.openPTY(req)
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, nil, err
	}
	closeAfter := []*os.File{null}
	stdinFd := null.Fd()
	if req.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(closeAfter)
			return nil, nil, err
		}
		closeAfter = append(closeAfter, r)
		p.stdin, stdinFd = w, r.Fd()
	}
	fds := []uintptr{stdinFd}
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(closeAfter)
			p.closeFiles()
			return nil, nil, err
		}
		closeAfter = append(closeAfter, w)
		p.outputs = append(p.outputs, r)
		fds = append(fds, w.Fd())
	}
	return fds, closeAfter, nil
}

func (p *proc) openPTY(req *backend.ExecRequest) ([]uintptr, []*os.File, error) {
	master, tty, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	rows, cols := req.Rows, req.Cols
	if rows == 0 || cols == 0 {
		rows, cols = 24, 80
	}
	_ = pty.Setsize(master, &pty.Winsize{Rows: rows, Cols: cols})
	// A non-blocking fd puts the master in the runtime poller, so reads
	// honour deadlines and Close interrupts them.
	fd, err := unix.Dup(int(master.Fd()))
	master.Close()
	if err != nil {
		tty.Close()
		return nil, nil, err
	}
	unix.CloseOnExec(fd)
	_ = unix.SetNonblock(fd, true)
	m := os.NewFile(uintptr(fd), "ptmx")
	p.master, p.stdin = m, m
	p.outputs = []*os.File{m}
	return []uintptr{tty.Fd(), tty.Fd(), tty.Fd()}, []*os.File{tty}, nil
}

func (p *proc) startReaders() {
	for i, f := range p.outputs {
		p.readers.Add(1)
		go p.readOutput(f, backend.Stream(i+1))
	}
	go func() {
		p.readers.Wait()
		p.finish()
	}()
}

func (p *proc) readOutput(f *os.File, stream backend.Stream) {
	defer p.readers.Done()
	for {
		buf := make([]byte, 32<<10)
		n, err := f.Read(buf)
		if n > 0 {
			p.append(stream, buf[:n])
		}
		if err != nil {
			return
		}
	}
}

func (p *proc) append(stream backend.Stream, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.logBytes > p.s.cfg.MaxLog && len(p.chunks) > 0 && p.chunks[0].seq >= p.minCursor() {
		p.cond.Wait()
	}
	p.chunks = append(p.chunks, chunk{seq: p.nextSeq, stream: stream, data: data})
	p.nextSeq++
	p.logBytes += len(data)
	for p.logBytes > p.s.cfg.MaxLog && len(p.chunks) > 1 && p.chunks[0].seq < p.minCursor() {
		p.logBytes -= len(p.chunks[0].data)
		p.lost += uint64(len(p.chunks[0].data))
		p.chunks[0] = chunk{}
		p.chunks = p.chunks[1:]
	}
	p.cond.Broadcast()
}

// exited is called by the reaper with the process's wait status.
func (p *proc) exitedWith(ws syscall.WaitStatus) {
	if p.timer != nil {
		p.timer.Stop()
	}
	p.mu.Lock()
	p.exited = true
	st := backend.ExitStatus{Code: ws.ExitStatus()}
	if ws.Signaled() {
		st.Code = -1
		st.Signal = unix.SignalName(ws.Signal())
		st.TimedOut = p.reason == "timeout"
		st.Killed = p.reason == "killed"
	}
	p.status = st
	p.cond.Broadcast()
	p.mu.Unlock()
	deadline := time.Now().Add(drainGrace)
	for _, f := range p.outputs {
		_ = f.SetReadDeadline(deadline)
	}
}

// finish runs once the output readers have stopped and marks the status
// final. A process whose output closed before it exited waits for the reaper.
func (p *proc) finish() {
	p.mu.Lock()
	for !p.exited {
		p.cond.Wait()
	}
	p.done = true
	p.status.Lost = p.lost
	p.cond.Broadcast()
	p.mu.Unlock()
	p.closeFiles()
	p.s.retire(p)
}

func (p *proc) closeFiles() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.outputs {
		f.Close()
	}
	if p.stdin != nil && p.stdin != p.master {
		p.stdin.Close()
	}
	p.stdin = nil
}

// kill signals the whole process group with SIGKILL and records why.
func (p *proc) kill(reason string) {
	p.mu.Lock()
	if p.exited {
		p.mu.Unlock()
		return
	}
	if p.reason == "" {
		p.reason = reason
	}
	p.mu.Unlock()
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
}

func (p *proc) signal(sig syscall.Signal) error {
	if sig <= 0 || sig > 64 {
		return fmt.Errorf("signal %d: %w", sig, errdefs.ErrInvalidArgument)
	}
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited {
		return fmt.Errorf("process %s has exited: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	if sig == syscall.SIGKILL {
		p.kill("killed")
		return nil
	}
	if err := syscall.Kill(-p.pid, sig); err != nil {
		return syscall.Kill(p.pid, sig)
	}
	return nil
}

func (p *proc) write(data []byte) error {
	p.mu.Lock()
	w := p.stdin
	p.mu.Unlock()
	if w == nil {
		return fmt.Errorf("stdin of process %s is closed: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	_, err := w.Write(data)
	return err
}

func (p *proc) closeStdin() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stdin == nil {
		return
	}
	if p.tty {
		// EOF on a terminal is ^D at the start of a line.
		_, _ = p.stdin.Write([]byte{4})
		return
	}
	p.stdin.Close()
	p.stdin = nil
}

func (p *proc) resize(rows, cols uint16) error {
	if p.master == nil {
		return fmt.Errorf("process %s has no terminal: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	if rows == 0 || cols == 0 {
		return fmt.Errorf("terminal size %dx%d: %w", rows, cols, errdefs.ErrInvalidArgument)
	}
	return pty.Setsize(p.master, &pty.Winsize{Rows: rows, Cols: cols})
}

// minCursor is the lowest seq an attached stream still has to send.
func (p *proc) minCursor() uint64 {
	m := p.nextSeq + 1
	for c := range p.cursors {
		m = min(m, *c)
	}
	return m
}

// attach registers a stream's cursor; the returned func removes it.
func (p *proc) attach(cursor *uint64) func() {
	p.mu.Lock()
	if p.cursors == nil {
		p.cursors = map[*uint64]struct{}{}
	}
	p.cursors[cursor] = struct{}{}
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		delete(p.cursors, cursor)
		p.cond.Broadcast()
		p.mu.Unlock()
	}
}

// advance records that a stream has sent everything before seq.
func (p *proc) advance(cursor *uint64, seq uint64) {
	p.mu.Lock()
	*cursor = seq
	p.cond.Broadcast()
	p.mu.Unlock()
}

// next waits for output at or after seq, for the exit, or for stop. It
// returns the chunks to send and whether the process is done.
func (p *proc) next(seq uint64, stop *bool) ([]chunk, bool, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for seq >= p.nextSeq && !p.done && !*stop {
		p.cond.Wait()
	}
	if len(p.chunks) > 0 && seq < p.chunks[0].seq {
		seq = p.chunks[0].seq
	}
	var out []chunk
	if len(p.chunks) > 0 && seq < p.nextSeq {
		i := int(seq - p.chunks[0].seq)
		out = append(out, p.chunks[i:]...)
	}
	return out, p.done, p.nextSeq
}

// dropLog frees a finished process's retained output.
func (p *proc) dropLog() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done {
		return
	}
	p.lost += uint64(p.logBytes)
	p.chunks, p.logBytes = nil, 0
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
