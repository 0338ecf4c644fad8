package hutch_test

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	hutch "github.com/hutch-dev/hutch/sdk"
)

func testProcesses(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	p, err := sb.StartProcess(ctx, `cat; echo done >&2`, hutch.ProcessOptions{Tag: "cat", Stdin: true})
	if err != nil || p.ID == "" || !p.Running || p.Tag != "cat" {
		t.Fatalf("start: %+v, %v", p, err)
	}
	if got, err := sb.Process(ctx, "cat"); err != nil || got.ID != p.ID {
		t.Fatalf("by tag: %+v, %v", got, err)
	}
	if err := sb.WriteStdin(ctx, p.ID, []byte("abc"), false); err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteStdin(ctx, "cat", allBytes, true); err != nil {
		t.Fatal(err)
	}
	done, err := sb.Wait(ctx, p.ID, 10*time.Second)
	if err != nil || done.Running || done.Exit == nil || !done.Exit.Success() {
		t.Fatalf("wait: %+v, %v", done, err)
	}
	var out, errb bytes.Buffer
	st, err := sb.ProcessOutput(ctx, p.ID, 0, false, hutch.StreamHandler{Stdout: &out, Stderr: &errb})
	if err != nil || st == nil || !st.Success() {
		t.Fatalf("output: %+v, %v", st, err)
	}
	if !bytes.Equal(out.Bytes(), append([]byte("abc"), allBytes...)) || errb.String() != "done\n" {
		t.Fatalf("output %q / %q", out.Bytes(), errb.String())
	}
	var rec recorder
	if _, err := sb.ProcessOutput(ctx, p.ID, 1, false, hutch.StreamHandler{OnEvent: rec.on}); err != nil {
		t.Fatal(err)
	}
	for _, ev := range rec.events {
		if ev.Type == hutch.EventOutput && ev.Seq < 1 {
			t.Fatalf("from_seq 1 sent seq %d", ev.Seq)
		}
	}
	ps, err := sb.Processes(ctx)
	if err != nil || !slices.ContainsFunc(ps, func(x hutch.Process) bool { return x.ID == p.ID && !x.Running }) {
		t.Fatalf("processes %+v, %v", ps, err)
	}
	_, err = sb.Process(ctx, "no-such-process")
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	_, err = sb.ProcessOutput(ctx, "no-such-process", 0, false, hutch.StreamHandler{})
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	_, err = sb.StartProcess(ctx, "", hutch.ProcessOptions{})
	wantErr(t, err, hutch.ErrInvalidArgument, "invalid_argument")
}

func testProcessFollow(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	p, err := sb.StartProcess(ctx, `for i in 1 2 3; do echo $i; sleep 0.1; done; exit 5`, hutch.ProcessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	st, err := sb.ProcessOutput(ctx, p.ID, 0, true, hutch.StreamHandler{Stdout: &out})
	if err != nil || st == nil || st.Code() != 5 || out.String() != "1\n2\n3\n" {
		t.Fatalf("follow: %+v, %v, %q", st, err, out.String())
	}
	p, err = sb.StartProcess(ctx, `echo now; sleep 30`, hutch.ProcessOptions{Tag: "sleeper"})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, sb, p.ID, "now\n")
	st, err = sb.ProcessOutput(ctx, p.ID, 0, false, hutch.StreamHandler{})
	if err != nil || st != nil {
		t.Fatalf("a running process without follow: %+v, %v", st, err)
	}
	_, err = sb.Wait(ctx, p.ID, 200*time.Millisecond)
	wantErr(t, err, hutch.ErrDeadlineExceeded, "deadline_exceeded")
	if err := sb.Signal(ctx, "sleeper", "KILL"); err != nil {
		t.Fatal(err)
	}
}

// waitOutput waits until a process has printed want.
func waitOutput(t *testing.T, sb *hutch.Sandbox, id, want string) {
	t.Helper()
	for range 100 {
		var out bytes.Buffer
		if _, err := sb.ProcessOutput(ctxT(t), id, 0, false, hutch.StreamHandler{Stdout: &out}); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out.String(), want) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("process %s never printed %q", id, want)
}

func testProcessSignal(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	p, err := sb.StartProcess(ctx, `sleep 30`, hutch.ProcessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Signal(ctx, p.ID, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	done, err := sb.Wait(ctx, p.ID, 10*time.Second)
	if err != nil || done.Exit == nil || done.Exit.Signal != "SIGTERM" || done.Exit.Code() != 143 {
		t.Fatalf("terminated: %+v, %v", done, err)
	}
	wantErr(t, sb.Signal(ctx, p.ID, "SIGNOPE"), hutch.ErrInvalidArgument, "invalid_argument")
	p, err = sb.StartProcess(ctx, `sleep 30`, hutch.ProcessOptions{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if done, err := sb.Wait(ctx, p.ID, 10*time.Second); err != nil || !done.Exit.TimedOut {
		t.Fatalf("process timeout: %+v, %v", done, err)
	}
}

// testBackground: a streamed command WithBackground outlives its client.
func testBackground(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	stop := errors.New("hang up")
	_, err := sb.ExecStream(ctx, `echo one; sleep 0.5; echo two`, hutch.StreamHandler{OnEvent: func(ev hutch.Event) error {
		if ev.Type == hutch.EventOutput {
			return stop
		}
		return nil
	}}, hutch.WithBackground(), hutch.WithTag("bg"))
	if !errors.Is(err, stop) {
		t.Fatal(err)
	}
	p, err := sb.Wait(ctx, "bg", 10*time.Second)
	if err != nil || !p.Exit.Success() {
		t.Fatalf("background command: %+v, %v", p, err)
	}
	var out bytes.Buffer
	if _, err := sb.ProcessOutput(ctx, "bg", 0, false, hutch.StreamHandler{Stdout: &out}); err != nil || out.String() != "one\ntwo\n" {
		t.Fatalf("background output %q, %v", out.String(), err)
	}
}

// readUntil reads t's output until it contains want, and returns it.
func readUntil(t *testing.T, r io.Reader, want string) string {
	t.Helper()
	var got []byte
	buf := make([]byte, 4096)
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(string(got), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in %q", want, got)
		}
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("read: %v after %q (want %q)", err, got, want)
		}
	}
	return string(got)
}

func testTerminal(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	p, err := sb.OpenTerminal(ctx, hutch.TerminalOptions{Tag: "term", Rows: 30, Cols: 100})
	if err != nil || !p.TTY {
		t.Fatalf("open: %+v, %v", p, err)
	}
	term, err := sb.AttachTerminal(ctx, "term", -1)
	if err != nil || term.ProcessID != p.ID {
		t.Fatalf("attach: %+v, %v", term, err)
	}
	if _, err := io.WriteString(term, "stty size; echo hello-$((1+2))\n"); err != nil {
		t.Fatal(err)
	}
	if out := readUntil(t, term, "hello-3\r\n"); !strings.Contains(out, "30 100") {
		t.Fatalf("terminal size in %q", out)
	}
	_ = term.Close() // detach
	if p, err := sb.Process(ctx, p.ID); err != nil || !p.Running {
		t.Fatalf("a detached terminal runs on: %+v, %v", p, err)
	}
	term, err = sb.AttachTerminal(ctx, p.ID, -1)
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, term, "hello-3") // the scrollback
	if err := sb.ResizeTerminal(ctx, p.ID, 40, 120); err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(term, "stty size\n")
	readUntil(t, term, "40 120")
	_ = term.Close()
	term, err = sb.AttachTerminal(ctx, p.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := term.Resize(25, 90); err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(term, "stty size; exit 3\n")
	if out := readUntil(t, term, "25 90"); strings.Contains(out, "hello-3") {
		t.Fatalf("scrollback 0 replayed %q", out)
	}
	if rest, err := io.ReadAll(term); err != nil {
		t.Fatalf("read to the exit: %v after %q", err, rest)
	}
	if st := term.Exit(); st == nil || st.Code() != 3 {
		t.Fatalf("terminal exit %+v", st)
	}
	_ = term.Close()
}

func testTerminalErrors(t *testing.T, e *env) {
	ctx := ctxT(t)
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	p, err := sb.StartProcess(ctx, `sleep 30`, hutch.ProcessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sb.AttachTerminal(ctx, p.ID, -1)
	wantErr(t, err, hutch.ErrFailedPrecondition, "failed_precondition")
	_, err = sb.AttachTerminal(ctx, "no-such-process", -1)
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	wantErr(t, sb.ResizeTerminal(ctx, p.ID, 0, 0), hutch.ErrInvalidArgument, "invalid_argument")
	_ = sb.Signal(ctx, p.ID, "KILL")
}
