package hutch

import (
	"bytes"
	"context"
	"time"

	"github.com/hutch-dev/hutch/api"
)

// ProcessOptions describe a background process.
type ProcessOptions struct {
	Cwd   string
	Env   map[string]string
	Tag   string // find it later by tag as well as by id
	Stdin bool   // keep stdin open for WriteStdin
	TTY   bool   // run it on a terminal
	Rows  int    // terminal size
	Cols  int
	// Timeout kills it after this long; 0 = it runs until it exits.
	Timeout time.Duration
}

// StartProcess starts cmd (with sh -c) in the background. It lives until it
// exits or is killed; no client ends it. Its output is kept, numbered, for
// ProcessOutput.
func (s *Sandbox) StartProcess(ctx context.Context, cmd string, o ProcessOptions) (*Process, error) {
	req := api.StartProcessRequest{Cmd: cmd, Cwd: o.Cwd, Env: o.Env, Tag: o.Tag, Stdin: o.Stdin, Tty: o.TTY,
		Rows: o.Rows, Cols: o.Cols, Timeout: o.Timeout.Seconds()}
	r, err := s.c.api.StartProcessWithResponse(ctx, s.ID, req)
	if err := s.c.check(r, err); err != nil {
		return nil, err
	}
	return process(r.JSON201)
}

func process(p *api.Process) (*Process, error) {
	if p == nil {
		return nil, protocolError("no process in the body")
	}
	return fromAPIProcess(*p), nil
}

// Processes lists the sandbox's process table: running processes and
// recently finished ones.
func (s *Sandbox) Processes(ctx context.Context) ([]Process, error) {
	r, err := s.c.api.ListProcessesWithResponse(ctx, s.ID)
	if err := s.c.check(r, err); err != nil {
		return nil, err
	}
	list, err := must(r.JSON200)
	if err != nil {
		return nil, err
	}
	out := make([]Process, 0, len(list.Processes))
	for _, p := range list.Processes {
		out = append(out, *fromAPIProcess(p))
	}
	return out, nil
}

// Process returns a process by id, or by tag (the newest carrying it).
func (s *Sandbox) Process(ctx context.Context, idOrTag string) (*Process, error) {
	r, err := s.c.api.GetProcessWithResponse(ctx, s.ID, idOrTag)
	if err := s.c.check(r, err); err != nil {
		return nil, err
	}
	return process(r.JSON200)
}

// ProcessOutput sends a process's output from sequence number fromSeq on
// to h. Without follow it sends what there is now and returns; with follow
// it goes on until the process exits. The status is nil when the stream
// ended before the exit.
func (s *Sandbox) ProcessOutput(ctx context.Context, id string, fromSeq int64, follow bool, h StreamHandler) (*ExitStatus, error) {
	p := api.ProcessOutputParams{FromSeq: fromSeq, Follow: follow}
	resp, err := s.c.api.ProcessOutput(ctx, s.ID, id, &p, acceptNDJSON)
	if err := s.c.checkHTTP(resp, err); err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readEvents(resp.Body, h)
}

// WriteStdin writes data to a process's stdin (it must have been started
// with Stdin, or be a terminal); with closeAfter, stdin is closed after.
func (s *Sandbox) WriteStdin(ctx context.Context, id string, data []byte, closeAfter bool) error {
	p := api.WriteProcessStdinParams{Close: closeAfter}
	r, err := s.c.api.WriteProcessStdinWithBodyWithResponse(ctx, s.ID, id, &p, "application/octet-stream", bytes.NewReader(data))
	return s.c.check(r, err)
}

// Signal sends a signal ("TERM", "SIGKILL", "9") to a process's group.
func (s *Sandbox) Signal(ctx context.Context, id, sig string) error {
	r, err := s.c.api.SignalProcessWithResponse(ctx, s.ID, id, api.SignalRequest{Signal: sig})
	return s.c.check(r, err)
}

// Wait waits until a process exits and returns it. After timeout (0: the
// daemon's default, 300s) it returns an error matching ErrDeadlineExceeded
// and the process runs on.
func (s *Sandbox) Wait(ctx context.Context, id string, timeout time.Duration) (*Process, error) {
	var p api.WaitProcessParams
	if timeout > 0 {
		sec := timeout.Seconds()
		p.Timeout = &sec
	}
	r, err := s.c.api.WaitProcessWithResponse(ctx, s.ID, id, &p)
	if err := s.c.check(r, err); err != nil {
		return nil, err
	}
	return process(r.JSON200)
}
