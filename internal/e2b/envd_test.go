package e2b_test

import (
	"bytes"
	"context"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/hutch-dev/hutch/internal/e2b"
	fspb "github.com/hutch-dev/hutch/internal/e2b/envdpb/filesystem"
	processpb "github.com/hutch-dev/hutch/internal/e2b/envdpb/process"
)

// result collects a process stream.
type result struct {
	pid            uint32
	stdout, stderr string
	end            *processpb.ProcessEvent_EndEvent
}

type eventStream interface {
	Receive() bool
	Err() error
}

func collect[T interface {
	GetEvent() *processpb.ProcessEvent
}](s interface {
	eventStream
	Msg() T
}, stopAfterStart bool) (result, error) {
	var r result
	for s.Receive() {
		ev := s.Msg().GetEvent()
		switch e := ev.GetEvent().(type) {
		case *processpb.ProcessEvent_Start:
			r.pid = e.Start.GetPid()
			if stopAfterStart {
				return r, nil
			}
		case *processpb.ProcessEvent_Data:
			r.stdout += string(e.Data.GetStdout()) + string(e.Data.GetPty())
			r.stderr += string(e.Data.GetStderr())
		case *processpb.ProcessEvent_End:
			r.end = e.End
		}
	}
	return r, s.Err()
}

func bash(cmd string) *processpb.ProcessConfig {
	return &processpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}
}

func TestProcessStart(t *testing.T) {
	r := newRig(t)
	c := r.create(map[string]any{"envVars": map[string]string{"SBX": "yes"}})
	e := r.envd(c)
	ctx := t.Context()
	cwd := "/tmp"
	cfg := bash(`echo "$SBX $FOO $(pwd)"; echo oops >&2; exit 3`)
	cfg.Envs, cfg.Cwd = map[string]string{"FOO": "foo"}, &cwd
	s, err := e.proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: cfg}))
	if err != nil {
		t.Fatal(err)
	}
	res, err := collect(s, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.pid == 0 || res.stdout != "yes foo /tmp\n" || res.stderr != "oops\n" || res.end == nil || res.end.GetExitCode() != 3 || !res.end.GetExited() {
		t.Fatalf("got %+v", res)
	}

	// The client's deadline is the command's timeout: DeadlineExceeded,
	// and the process is gone.
	tctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer cancel()
	s, err = e.proc.Start(tctx, connect.NewRequest(&processpb.StartRequest{Process: bash("sleep 30")}))
	if err == nil {
		_, err = collect(s, false)
	}
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("timeout: %v, want deadline_exceeded", err)
	}
	waitNoProcs(t, e)

	// Stdin: send, close, and the process sees EOF.
	s, err = e.proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: bash("cat; echo done"), Stdin: ptr(true)}))
	if err != nil {
		t.Fatal(err)
	}
	head, _ := collect(s, true)
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: head.pid}}
	if _, err := e.proc.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel,
		Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("hello\n")}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	res, err = collect(s, false)
	if err != nil || res.stdout != "hello\ndone\n" || res.end.GetExitCode() != 0 {
		t.Fatalf("stdin: %+v %v", res, err)
	}
}

func ptr[T any](v T) *T { return &v }

func waitNoProcs(t *testing.T, e envd) {
	t.Helper()
	for range 50 {
		l, err := e.proc.List(t.Context(), connect.NewRequest(&processpb.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Msg.GetProcesses()) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("a process outlived its timeout")
}

func TestProcessBackgroundAndReconnect(t *testing.T) {
	r := newRig(t)
	c := r.create(nil)
	e := r.envd(c)
	ctx := t.Context()
	sctx, stop := context.WithCancel(ctx)
	s, err := e.proc.Start(sctx, connect.NewRequest(&processpb.StartRequest{Process: bash("read x; echo got $x"), Tag: ptr("job"), Stdin: ptr(true)}))
	if err != nil {
		t.Fatal(err)
	}
	head, _ := collect(s, true)
	stop() // the client goes away; the process runs on
	l, err := e.proc.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if err != nil || len(l.Msg.GetProcesses()) != 1 {
		t.Fatalf("list: %v %v", l, err)
	}
	p := l.Msg.GetProcesses()[0]
	if p.GetPid() != head.pid || p.GetTag() != "job" || p.GetConfig().GetArgs()[2] != "read x; echo got $x" {
		t.Fatalf("listed %v", p)
	}
	byTag := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Tag{Tag: "job"}}
	cs, err := e.proc.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: byTag}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan result, 1)
	go func() {
		res, _ := collect(cs, false)
		done <- res
	}()
	time.Sleep(200 * time.Millisecond)
	if _, err := e.proc.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: byTag,
		Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("it\n")}}})); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res.pid != head.pid || res.stdout != "got it\n" || res.end.GetExitCode() != 0 {
			t.Fatalf("reconnected: %+v", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no end after reconnect")
	}

	// Signals: SIGKILL ends a process; an unknown pid is NotFound.
	s, err = e.proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: bash("sleep 60")}))
	if err != nil {
		t.Fatal(err)
	}
	head, _ = collect(s, true)
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: head.pid}}
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	res, _ := collect(s, false)
	if res.end == nil || res.end.GetExited() || !strings.Contains(res.end.GetStatus(), "kill") {
		t.Fatalf("killed: %+v", res.end)
	}
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("signal to a finished process: %v", err)
	}
}

func TestProcessPTY(t *testing.T) {
	r := newRig(t)
	e := r.envd(r.create(nil))
	ctx := t.Context()
	s, err := e.proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: bash("read x; stty size"),
		Pty: &processpb.PTY{Size: &processpb.PTY_Size{Rows: 20, Cols: 70}}}))
	if err != nil {
		t.Fatal(err)
	}
	head, _ := collect(s, true)
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: head.pid}}
	if _, err := e.proc.Update(ctx, connect.NewRequest(&processpb.UpdateRequest{Process: sel, Pty: &processpb.PTY{Size: &processpb.PTY_Size{Rows: 33, Cols: 99}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proc.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel,
		Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Pty{Pty: []byte("\n")}}})); err != nil {
		t.Fatal(err)
	}
	res, err := collect(s, false)
	if err != nil || !strings.Contains(res.stdout, "33 99") {
		t.Fatalf("pty: %q %v", res.stdout, err)
	}
}

func TestFilesystem(t *testing.T) {
	r := newRig(t)
	c := r.create(nil)
	e := r.envd(c)
	ctx := t.Context()
	mk, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "a/b"}))
	if err != nil || mk.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || mk.Msg.GetEntry().GetPath() != "/workspace/a/b" {
		t.Fatalf("mkdir: %v %v", mk, err)
	}
	if _, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "a/b"})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("mkdir again: %v", err)
	}
	upload(t, e, "a/b/f.txt", "hello")
	if got := download(t, e, "/workspace/a/b/f.txt", 200); got != "hello" {
		t.Fatalf("read back %q", got)
	}
	download(t, e, "a/missing", 404)
	st, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "a/b/f.txt"}))
	if err != nil || st.Msg.GetEntry().GetSize() != 5 || st.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_FILE || st.Msg.GetEntry().GetOwner() != "root" {
		t.Fatalf("stat: %v %v", st, err)
	}
	if _, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "nope"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("stat missing: %v", err)
	}
	mv, err := e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "a/b/f.txt", Destination: "a/g.txt"}))
	if err != nil || mv.Msg.GetEntry().GetName() != "g.txt" {
		t.Fatalf("move: %v %v", mv, err)
	}
	ls, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "a", Depth: 1}))
	if err != nil || names(ls.Msg.GetEntries()) != "b g.txt" {
		t.Fatalf("list depth 1: %v %v", names(ls.Msg.GetEntries()), err)
	}
	upload(t, e, "a/b/deep.txt", "x")
	ls, _ = e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "a", Depth: 2}))
	if names(ls.Msg.GetEntries()) != "b deep.txt g.txt" {
		t.Fatalf("list depth 2: %v", names(ls.Msg.GetEntries()))
	}
	if _, err := e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "a"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("after remove: %v", err)
	}
	// A wrong token, or none, is refused.
	hc := &http.Client{Transport: headerRT{base: r.client.Transport, hdr: http.Header{"E2b-Sandbox-Id": {c.SandboxID}, "X-Access-Token": {"nope"}}}}
	resp, err := hc.Get(r.url + "/files?path=x")
	if err != nil || resp.StatusCode != 401 {
		t.Fatalf("bad token: %v %v", err, resp)
	}
}

func names(es []*fspb.EntryInfo) string {
	var out []string
	for _, e := range es {
		out = append(out, e.GetName())
	}
	return strings.Join(out, " ")
}

func upload(t *testing.T, e envd, path, content string) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", path)
	io.WriteString(fw, content)
	mw.Close()
	resp, err := e.http.Post(e.url+"/files", mw.FormDataContentType(), &body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("upload %s: %v %v", path, err, resp)
	}
	resp.Body.Close()
}

func download(t *testing.T, e envd, path string, want int) string {
	t.Helper()
	resp, err := e.http.Get(e.url + "/files?path=" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("download %s: %d %s", path, resp.StatusCode, b)
	}
	return string(b)
}

func TestWatchDir(t *testing.T) {
	r := newRig(t)
	e := r.envd(r.create(nil))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if _, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "w/sub"})); err != nil {
		t.Fatal(err)
	}
	s, err := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "w", Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() || s.Msg().GetStart() == nil {
		t.Fatalf("no start event: %v", s.Err())
	}
	upload(t, e, "w/sub/new.txt", "x")
	want := map[string]bool{"sub/new.txt create": false, "sub/new.txt write": false}
	deadline := time.AfterFunc(10*time.Second, cancel)
	defer deadline.Stop()
	for s.Receive() {
		if ev := s.Msg().GetFilesystem(); ev != nil {
			k := ev.GetName() + " " + strings.ToLower(strings.TrimPrefix(ev.GetType().String(), "EVENT_TYPE_"))
			if _, ok := want[k]; ok {
				want[k] = true
			}
		}
		if want["sub/new.txt create"] && want["sub/new.txt write"] {
			break
		}
	}
	if !want["sub/new.txt create"] || !want["sub/new.txt write"] {
		t.Fatalf("events seen: %v (%v)", want, s.Err())
	}
	for p, want := range map[string]connect.Code{"w/sub/new.txt": connect.CodeInvalidArgument, "nope": connect.CodeNotFound} {
		s, err := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: p}))
		if err == nil && !s.Receive() {
			err = s.Err()
		}
		if connect.CodeOf(err) != want {
			t.Fatalf("watching %s: %v, want %v", p, err, want)
		}
	}

	// The polling form.
	cw, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "w"}))
	if err != nil {
		t.Fatal(err)
	}
	upload(t, e, "w/p.txt", "y")
	var got []string
	for range 50 {
		ev, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: cw.Msg.GetWatcherId()}))
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range ev.Msg.GetEvents() {
			got = append(got, x.GetName())
		}
		if len(got) > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(got) == 0 || got[0] != "p.txt" {
		t.Fatalf("polled %v", got)
	}
	if _, err := e.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: cw.Msg.GetWatcherId()})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: cw.Msg.GetWatcherId()})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("removed watcher: %v", err)
	}
}

func TestProcessStreamInput(t *testing.T) {
	r := newRig(t)
	e := r.envd(r.create(nil))
	ctx := t.Context()
	s, err := e.proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: bash("head -c 10"), Stdin: ptr(true)}))
	if err != nil {
		t.Fatal(err)
	}
	head, _ := collect(s, true)
	in := e.proc.StreamInput(ctx)
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: head.pid}}
	msgs := []*processpb.StreamInputRequest{
		{Event: &processpb.StreamInputRequest_Start{Start: &processpb.StreamInputRequest_StartEvent{Process: sel}}},
		{Event: &processpb.StreamInputRequest_Keepalive{Keepalive: &processpb.StreamInputRequest_KeepAlive{}}},
	}
	for _, chunk := range []string{"01234", "56789"} {
		msgs = append(msgs, &processpb.StreamInputRequest{Event: &processpb.StreamInputRequest_Data{Data: &processpb.StreamInputRequest_DataEvent{
			Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte(chunk)}}}}})
	}
	for _, m := range msgs {
		if err := in.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	res, err := collect(s, false)
	if err != nil || res.stdout != "0123456789" || res.end.GetExitCode() != 0 {
		t.Fatalf("streamed input: %+v %v", res, err)
	}
}

func TestEnvdRefusals(t *testing.T) {
	r := newRig(t)
	c := r.create(nil) // created without autoResume
	e := r.envd(c)
	ctx := t.Context()
	if st := r.do("POST", "/sandboxes/"+c.SandboxID+"/pause", map[string]any{}, nil); st != http.StatusNoContent {
		t.Fatalf("pause: %d", st)
	}
	_, err := e.proc.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("envd call on a paused sandbox without autoResume: %v", err)
	}
	bad := c
	bad.EnvdAccessToken = "wrong"
	_, err = r.envd(bad).fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/"}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("bad token over connect: %v", err)
	}

	// With autoResume, traffic resumes it.
	c2 := r.create(map[string]any{"autoResume": map[string]bool{"enabled": true}})
	r.do("POST", "/sandboxes/"+c2.SandboxID+"/pause", map[string]any{}, nil)
	if _, err := r.envd(c2).proc.List(ctx, connect.NewRequest(&processpb.ListRequest{})); err != nil {
		t.Fatalf("envd call with autoResume: %v", err)
	}
	var got created
	if r.do("GET", "/sandboxes/"+c2.SandboxID, nil, &got); got.State != "running" {
		t.Fatalf("after traffic: %q", got.State)
	}
}

// TestBadInput: malformed requests get a clear error with a code, never a
// 500 or a hang.
func TestBadInput(t *testing.T) {
	r := newRig(t)
	c := r.create(nil)
	e := r.envd(c)
	ctx := t.Context()
	for _, tc := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/v2/sandboxes", "{not json", 400},
		{"POST", "/v2/sandboxes", `{"timeout": "soon"}`, 400},
		{"POST", "/v2/sandboxes", `{"envVars": {"A=B": "v"}}`, 400},
		{"POST", "/v2/sandboxes", `{"envVars": {"A": "v\u0000"}}`, 400},
		{"POST", "/sandboxes/" + c.SandboxID + "/timeout", `{}`, 400},
		{"POST", "/sandboxes/" + c.SandboxID + "/timeout", `{"timeout": 0}`, 400},
		{"GET", "/v2/sandboxes?limit=0", "", 400},
		{"GET", "/v2/sandboxes?order=sideways", "", 400},
		{"GET", "/sandboxes/%00", "", 404},
		{"PATCH", "/sandboxes/" + c.SandboxID, "{}", 404},
	} {
		req, _ := http.NewRequest(tc.method, r.url+tc.path, strings.NewReader(tc.body))
		req.Header.Set("X-API-KEY", r.key)
		resp, err := r.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || !strings.Contains(string(b), `"code":`) {
			t.Errorf("%s %s %.40q: %d %s, want %d with an E2B error body", tc.method, tc.path, tc.body, resp.StatusCode, b, tc.want)
		}
	}
	for name, call := range map[string]func() error{
		"start without cmd": func() error {
			s, err := e.proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{}))
			if err == nil && !s.Receive() {
				err = s.Err()
			}
			return err
		},
		"signal 0": func() error {
			_, err := e.proc.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: 1}}}))
			return err
		},
		"empty selector": func() error {
			_, err := e.proc.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: &processpb.ProcessSelector{}}))
			return err
		},
		"bad env": func() error {
			cfg := bash("true")
			cfg.Envs = map[string]string{"": "x"}
			s, err := e.proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: cfg}))
			if err == nil && !s.Receive() {
				err = s.Err()
			}
			return err
		},
		"relative cwd": func() error {
			cfg := bash("true")
			cfg.Cwd = ptr("rel")
			s, err := e.proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: cfg}))
			if err == nil && !s.Receive() {
				err = s.Err()
			}
			return err
		},
		"NUL in a path": func() error {
			_, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "a\x00b"}))
			return err
		},
		"empty path": func() error {
			_, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{}))
			return err
		},
	} {
		if code := connect.CodeOf(call()); code != connect.CodeInvalidArgument {
			t.Errorf("%s: %v, want invalid_argument", name, code)
		}
	}
	if _, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "/etc/hostname"})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("listing a file: %v", err)
	}
	for _, u := range []string{"/files", "/files?path=/etc"} {
		resp, err := e.http.Get(e.url + u)
		if err != nil || resp.StatusCode != 400 {
			t.Errorf("GET %s: %v %v, want 400", u, err, resp)
		}
	}
	resp, err := e.http.Post(e.url+"/files", "multipart/form-data; boundary=x", strings.NewReader("--x--\r\n"))
	if err != nil || resp.StatusCode != 400 {
		t.Errorf("upload without a file: %v %v", err, resp)
	}
}

// TestSweep: what the handler keeps per sandbox goes once the sandbox has
// ended some other way than E2B's kill (here hutch's own delete).
func TestSweep(t *testing.T) {
	defer e2b.SetSweep(0)()
	r := newRig(t)
	ctx := t.Context()
	a, b := r.create(nil), r.create(nil)
	for _, c := range []created{a, b} {
		s, err := r.envd(c).proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: bash("true")}))
		if err != nil {
			t.Fatal(err)
		}
		collect(s, false)
	}
	if _, err := r.envd(a).fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "/tmp"})); err != nil {
		t.Fatal(err)
	}
	if err := r.mgr.Delete(ctx, "", a.SandboxID); err != nil {
		t.Fatal(err)
	}
	s, err := r.envd(b).proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: bash("true")}))
	if err != nil {
		t.Fatal(err)
	}
	collect(s, false)
	for _, id := range r.h.Tracked() {
		if id == a.SandboxID {
			t.Fatalf("still tracking deleted sandbox %s: %v", id, r.h.Tracked())
		}
	}
}
