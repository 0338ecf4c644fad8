package hutch_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	hutch "github.com/hutch-dev/hutch/sdk"
)

// allBytes is every byte value, twice: no encoding may change it.
var allBytes = func() []byte {
	b := make([]byte, 512)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()

func testExec(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	res, err := sb.Exec(ctx, `echo out; echo err >&2; exit 3`)
	if err != nil {
		t.Fatal(err)
	}
	if *res.ExitCode != 3 || res.Code() != 3 || res.Success() || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
		t.Fatalf("result %+v", res)
	}
	res, err = sb.Exec(ctx, `pwd; echo "$A$B"`, hutch.WithCwd("/etc"),
		hutch.WithEnv(map[string]string{"A": "x"}), hutch.WithEnv(map[string]string{"B": "y"}))
	if err != nil || string(res.Stdout) != "/etc\nxy\n" || !res.Success() || res.Duration <= 0 {
		t.Fatalf("cwd and env: %+v, %v", res, err)
	}
	res, err = sb.Exec(ctx, `seq 1 1000`, hutch.WithMaxOutput(10))
	if err != nil || !res.StdoutTruncated || len(res.Stdout) != 10 || res.StderrTruncated {
		t.Fatalf("max output: %+v, %v", res, err)
	}
}

func testExecBinary(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	res, err := sb.Exec(ctx, `cat; cat >&2 /dev/null`, hutch.WithStdin(allBytes))
	if err != nil || !bytes.Equal(res.Stdout, allBytes) {
		t.Fatalf("binary stdin to stdout: %v, %q", err, res.Stdout)
	}
	res, err = sb.Exec(ctx, `printf '\377\000\376' >&2`)
	if err != nil || !bytes.Equal(res.Stderr, []byte{0xff, 0, 0xfe}) {
		t.Fatalf("binary stderr: %v, %q", err, res.Stderr)
	}
	var out bytes.Buffer
	st, err := sb.ExecStream(ctx, `cat`, hutch.StreamHandler{Stdout: &out}, hutch.WithStdin(allBytes))
	if err != nil || !st.Success() || !bytes.Equal(out.Bytes(), allBytes) {
		t.Fatalf("binary stream: %v, %+v, %q", err, st, out.Bytes())
	}
}

func testExecEnds(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	res, err := sb.Exec(ctx, `sleep 30`, hutch.WithTimeout(300*time.Millisecond))
	if err != nil || !res.TimedOut || res.Code() != 124 {
		t.Fatalf("timeout: %+v, %v", res, err)
	}
	res, err = sb.Exec(ctx, `kill -KILL $$`)
	if err != nil || res.ExitCode != nil || res.Signal != "SIGKILL" || res.Code() != 137 {
		t.Fatalf("killed: %+v, %v", res, err)
	}
	_, err = sb.Exec(ctx, "true", hutch.WithTimeout(5*time.Hour))
	wantErr(t, err, hutch.ErrInvalidArgument, "invalid_argument")
}

// recorder collects a stream's events.
type recorder struct {
	mu     sync.Mutex
	events []hutch.Event
}

func (r *recorder) on(ev hutch.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	return nil
}

// outputs is the output events as "stream:data" strings.
func (r *recorder) outputs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, ev := range r.events {
		if ev.Type == hutch.EventOutput {
			out = append(out, fmt.Sprintf("%s:%s", ev.Stream, ev.Data))
		}
	}
	return out
}

func testExecStream(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	var rec recorder
	var stdout, stderr bytes.Buffer
	h := hutch.StreamHandler{Stdout: &stdout, Stderr: &stderr, OnEvent: rec.on}
	st, err := sb.ExecStream(ctx, `for i in 1 2 3; do echo out$i; sleep 0.05; echo err$i >&2; sleep 0.05; done; exit 4`, h)
	if err != nil || st.Code() != 4 {
		t.Fatalf("stream: %+v, %v", st, err)
	}
	want := []string{"stdout:out1\n", "stderr:err1\n", "stdout:out2\n", "stderr:err2\n", "stdout:out3\n", "stderr:err3\n"}
	if got := rec.outputs(); strings.Join(got, "") != strings.Join(want, "") {
		t.Fatalf("events %q, want %q", got, want)
	}
	if stdout.String() != "out1\nout2\nout3\n" || stderr.String() != "err1\nerr2\nerr3\n" {
		t.Fatalf("writers got %q and %q", stdout.String(), stderr.String())
	}
	first, last := rec.events[0], rec.events[len(rec.events)-1]
	if first.Type != hutch.EventStart || first.ProcessID == "" || first.PID == 0 || last.Type != hutch.EventExit {
		t.Fatalf("first %+v, last %+v", first, last)
	}
	for i := 2; i < len(rec.events); i++ {
		if rec.events[i].Seq <= rec.events[i-1].Seq && rec.events[i-1].Type == hutch.EventOutput {
			t.Fatalf("sequence numbers do not grow: %+v", rec.events)
		}
	}
	stop := errors.New("enough")
	_, err = sb.ExecStream(ctx, `echo a`, hutch.StreamHandler{OnEvent: func(hutch.Event) error { return stop }})
	if !errors.Is(err, stop) {
		t.Fatalf("handler error: %v", err)
	}
	_, err = sb.ExecStream(ctx, "", hutch.StreamHandler{})
	wantErr(t, err, hutch.ErrInvalidArgument, "invalid_argument")
}

func testExecStreamCancel(t *testing.T, e *env) {
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	ctx, cancel := context.WithCancel(ctxT(t))
	started := time.Now()
	_, err := sb.ExecStream(ctx, `sleep 30`, hutch.StreamHandler{OnEvent: func(ev hutch.Event) error {
		if ev.Type == hutch.EventStart {
			time.AfterFunc(200*time.Millisecond, cancel)
		}
		return nil
	}}, hutch.WithTag("doomed"))
	if !errors.Is(err, context.Canceled) || time.Since(started) > 10*time.Second {
		t.Fatalf("cancelled stream: %v after %v", err, time.Since(started))
	}
	p, err := sb.Wait(ctxT(t), "doomed", 10*time.Second)
	if err != nil || p.Running || p.Exit == nil || p.Exit.Success() {
		t.Fatalf("the command should be killed with its client: %+v, %v", p, err)
	}
}

func testExecInteractive(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	s, err := sb.ExecInteractive(ctx, `read line; echo "got:$line"; cat; echo bye >&2`)
	if err != nil {
		t.Fatal(err)
	}
	if s.ProcessID == "" || s.PID == 0 {
		t.Fatalf("session %+v", s)
	}
	if _, err := s.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, len("got:hello\n"))
	if _, err := io.ReadFull(s.Stdout(), line); err != nil || string(line) != "got:hello\n" {
		t.Fatalf("interactive answer %q, %v", line, err)
	}
	if _, err := s.Write(allBytes); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(s.Stdout())
	errOut, _ := io.ReadAll(s.Stderr())
	st, err := s.Wait()
	if err != nil || !st.Success() || !bytes.Equal(rest, allBytes) || string(errOut) != "bye\n" {
		t.Fatalf("wait %+v, %v; stdout %q, stderr %q", st, err, rest, errOut)
	}
	s, err = sb.ExecInteractive(ctx, `cat`, hutch.WithStdin([]byte("preset")))
	if err != nil {
		t.Fatal(err)
	}
	_ = s.CloseStdin()
	if out, _ := io.ReadAll(s.Stdout()); string(out) != "preset" {
		t.Fatalf("WithStdin over a session: %q", out)
	}
	_, err = sb.ExecInteractive(ctx, "")
	wantErr(t, err, hutch.ErrInvalidArgument, "invalid_argument")
	_, err = e.sock.Sandbox("no-such-sandbox").ExecInteractive(ctx, "true")
	wantErr(t, err, hutch.ErrNotFound, "not_found")
}

func testExecInteractiveSignal(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	s, err := sb.ExecInteractive(ctx, `trap 'echo trapped; exit 7' TERM; echo ready; while :; do sleep 0.05; done`)
	if err != nil {
		t.Fatal(err)
	}
	ready := make([]byte, 6)
	if _, err := io.ReadFull(s.Stdout(), ready); err != nil {
		t.Fatal(err)
	}
	if err := s.Signal("TERM"); err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(s.Stdout())
	if st, err := s.Wait(); err != nil || st.Code() != 7 || string(out) != "trapped\n" {
		t.Fatalf("signalled: %+v, %v, %q", st, err, out)
	}
	s, err = sb.ExecInteractive(ctx, `sleep 30`, hutch.WithTag("hung-up"))
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if _, err := s.Wait(); err == nil {
		t.Fatal("a closed session should end without an exit")
	}
	p, err := sb.Wait(ctx, "hung-up", 10*time.Second)
	if err != nil || p.Running {
		t.Fatalf("hanging up should kill the command: %+v, %v", p, err)
	}
}
