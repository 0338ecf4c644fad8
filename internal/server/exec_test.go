package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hutch-dev/hutch/api"
)

func code(res api.ExecResult) string {
	if res.ExitCode == nil {
		return "null"
	}
	return fmt.Sprint(*res.ExitCode)
}

func TestExecBuffered(t *testing.T) {
	t.Parallel()
	d := shared(t)
	c := local(t, d)
	id := newSandbox(t, c, api.CreateSandboxRequest{Env: map[string]string{"SBX_VAR": "from-create"}}).Id

	t.Run("exit codes are results", func(t *testing.T) {
		for _, n := range []int{0, 1, 3, 255} {
			res := c.exec(id, api.ExecRequest{Cmd: fmt.Sprintf("exit %d", n)})
			if code(res) != fmt.Sprint(n) || res.TimedOut || res.Killed {
				t.Errorf("exit %d: %+v", n, res)
			}
		}
		res := c.exec(id, api.ExecRequest{Cmd: "kill -9 $$"})
		if res.ExitCode != nil || res.Signal == "" {
			t.Errorf("killed by a signal: exit_code %s, signal %q", code(res), res.Signal)
		}
	})
	t.Run("stdout, stderr, env, cwd", func(t *testing.T) {
		res := c.exec(id, api.ExecRequest{Cmd: "echo out; echo err >&2; echo $SBX_VAR $MINE; pwd", Cwd: "/tmp",
			Env: map[string]string{"MINE": "mine"}})
		if res.Stdout != "out\nfrom-create mine\n/tmp\n" || res.Stderr != "err\n" || res.Encoding != "utf8" {
			t.Fatalf("%+v", res)
		}
		if res.DurationMs <= 0 {
			t.Errorf("duration_ms %v", res.DurationMs)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		t0 := time.Now()
		res := c.exec(id, api.ExecRequest{Cmd: "echo before; sleep 30", Timeout: 0.3})
		if res.ExitCode != nil || !res.TimedOut || res.Stdout != "before\n" {
			t.Fatalf("%+v (exit %s)", res, code(res))
		}
		if el := time.Since(t0); el > 5*time.Second {
			t.Fatalf("a 0.3 s timeout took %v", el)
		}
	})
	t.Run("output caps", func(t *testing.T) {
		res := c.exec(id, api.ExecRequest{Cmd: "head -c 100000 /dev/zero | tr '\\0' a; head -c 5 /dev/zero | tr '\\0' b >&2", MaxOutput: 10})
		if res.Stdout != strings.Repeat("a", 10) || !res.StdoutTruncated || res.Stderr != "bbbbb" || res.StderrTruncated {
			t.Fatalf("%+v", res)
		}
		res = c.exec(id, api.ExecRequest{Cmd: "head -c 100000 /dev/zero | tr '\\0' a"})
		if len(res.Stdout) != 64<<10 || !res.StdoutTruncated {
			t.Fatalf("default cap: %d bytes, truncated %v", len(res.Stdout), res.StdoutTruncated)
		}
		res = c.exec(id, api.ExecRequest{Cmd: "head -c 65536 /dev/zero"})
		if len(res.Stdout) != 64<<10 || res.StdoutTruncated {
			t.Fatalf("exactly the cap: %d bytes, truncated %v", len(res.Stdout), res.StdoutTruncated)
		}
	})
	t.Run("binary exactness", func(t *testing.T) {
		all := make([]byte, 0, 3*256)
		for range 3 {
			for b := range 256 {
				all = append(all, byte(b))
			}
		}
		c.mustJSON("PUT", sbPath(id, "/files?path=bin"), all, 200, nil)
		res := c.exec(id, api.ExecRequest{Cmd: "cat bin; printf '\\377\\000' >&2", Encoding: "base64"})
		out, err := base64.StdEncoding.DecodeString(res.Stdout)
		if err != nil || !bytes.Equal(out, all) || res.Encoding != "base64" {
			t.Fatalf("stdout %d bytes (%v), encoding %q", len(out), err, res.Encoding)
		}
		if errb, _ := base64.StdEncoding.DecodeString(res.Stderr); !bytes.Equal(errb, []byte{0xff, 0}) {
			t.Fatalf("stderr %q", errb)
		}
		// Binary stdin, base64 both ways.
		res = c.exec(id, api.ExecRequest{Cmd: "cat", Stdin: base64.StdEncoding.EncodeToString(all),
			StdinEncoding: "base64", Encoding: "base64"})
		if out, _ := base64.StdEncoding.DecodeString(res.Stdout); !bytes.Equal(out, all) {
			t.Fatalf("stdin round trip: %d bytes", len(out))
		}
		// utf8 output replaces what is not UTF-8 and keeps what is.
		res = c.exec(id, api.ExecRequest{Cmd: "printf 'h\\303\\251\\377!'"})
		if res.Stdout != "hé\uFFFD!" {
			t.Fatalf("utf8 output %q", res.Stdout)
		}
	})
	t.Run("stdin", func(t *testing.T) {
		res := c.exec(id, api.ExecRequest{Cmd: "tr a-z A-Z", Stdin: "hello\nwörld"})
		if res.Stdout != "HELLO\nWöRLD" {
			t.Fatalf("%+v", res)
		}
		// Without stdin, a reader sees EOF at once.
		if res := c.exec(id, api.ExecRequest{Cmd: "cat; echo done", Timeout: 5}); res.Stdout != "done\n" || res.TimedOut {
			t.Fatalf("no stdin: %+v", res)
		}
	})
}

// readEvents reads NDJSON or SSE ExecEvents to the end of body.
func readEvents(t testing.TB, body io.Reader, sse bool) []api.ExecEvent {
	t.Helper()
	var evs []api.ExecEvent
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	lastType := ""
	for sc.Scan() {
		line := sc.Text()
		if sse {
			switch {
			case line == "":
				continue
			case strings.HasPrefix(line, "event: "):
				lastType = strings.TrimPrefix(line, "event: ")
				continue
			case strings.HasPrefix(line, "data: "):
				line = strings.TrimPrefix(line, "data: ")
			default:
				t.Fatalf("SSE line %q", line)
			}
		}
		var ev api.ExecEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("event %q: %v", line, err)
		}
		if sse && string(ev.Type) != lastType {
			t.Fatalf("SSE event: %q announces %q", lastType, ev.Type)
		}
		evs = append(evs, ev)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read events: %v", err)
	}
	return evs
}

// checkStream checks the shape every exec stream has: start, outputs with
// consecutive seqs from first, an exit whose seq is the next one.
func checkStream(t testing.TB, evs []api.ExecEvent, first int64) (stdout, stderr string, exit api.ExecEvent) {
	t.Helper()
	if len(evs) < 2 || evs[0].Type != api.ExecEventTypeStart || evs[0].ProcessId == "" || evs[0].Pid <= 0 {
		t.Fatalf("stream does not begin with a start event: %+v", evs)
	}
	next := first
	var out, errb bytes.Buffer
	for i, ev := range evs[1:] {
		switch ev.Type {
		case api.ExecEventTypeOutput:
			if ev.Seq != next {
				t.Fatalf("event %d: seq %d, want %d", i+1, ev.Seq, next)
			}
			next++
			if ev.Stream == api.Stderr {
				errb.Write(ev.Data)
			} else {
				out.Write(ev.Data)
			}
		case api.ExecEventTypeExit:
			if i+2 != len(evs) {
				t.Fatalf("events after the exit: %+v", evs[i+2:])
			}
			if ev.Seq != next {
				t.Fatalf("exit seq %d, want %d", ev.Seq, next)
			}
			return out.String(), errb.String(), ev
		default:
			t.Fatalf("event %d: %+v", i+1, ev)
		}
	}
	t.Fatalf("no exit event in %+v", evs)
	return
}

func TestExecStream(t *testing.T) {
	t.Parallel()
	d := shared(t)
	c := local(t, d)
	id := newSandbox(t, c, api.CreateSandboxRequest{}).Id
	cmd := "for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; sleep 0.01; done; exit 7"
	for _, sse := range []bool{false, true} {
		t.Run(fmt.Sprintf("sse=%v", sse), func(t *testing.T) {
			var hdr []string
			if sse {
				hdr = []string{"Accept", "text/event-stream"}
			}
			r := c.do("POST", sbPath(id, "/exec/stream"), api.ExecRequest{Cmd: cmd}, hdr...)
			if r.Status != 200 {
				t.Fatalf("%s", r)
			}
			wantCT := "application/x-ndjson"
			if sse {
				wantCT = "text/event-stream"
			}
			if ct := r.Header.Get("Content-Type"); ct != wantCT {
				t.Fatalf("Content-Type %q, want %q", ct, wantCT)
			}
			out, errs, exit := checkStream(t, readEvents(t, bytes.NewReader(r.Body), sse), 0)
			if out != "out1\nout2\nout3\nout4\nout5\n" || errs != "err1\nerr2\nerr3\nerr4\nerr5\n" {
				t.Fatalf("stdout %q stderr %q", out, errs)
			}
			if exit.ExitCode == nil || *exit.ExitCode != 7 {
				t.Fatalf("exit %+v", exit)
			}
		})
	}
	t.Run("stdin and timeout", func(t *testing.T) {
		r := c.do("POST", sbPath(id, "/exec/stream"), api.ExecRequest{Cmd: "cat; sleep 30", Stdin: "piped", Timeout: 0.3})
		out, _, exit := checkStream(t, readEvents(t, bytes.NewReader(r.Body), false), 0)
		if out != "piped" || !exit.TimedOut || exit.ExitCode != nil {
			t.Fatalf("stdout %q exit %+v", out, exit)
		}
	})
	t.Run("a lot of output", func(t *testing.T) {
		const n = 20 << 20
		r := c.do("POST", sbPath(id, "/exec/stream"), api.ExecRequest{Cmd: fmt.Sprintf("head -c %d /dev/zero", n)})
		out, _, exit := checkStream(t, readEvents(t, bytes.NewReader(r.Body), false), 0)
		// All of it reached the attached client; the retained log (8 MiB)
		// dropped the older part, which lost counts.
		if len(out) != n || exit.Lost <= 0 || exit.Lost >= n || *exit.ExitCode != 0 {
			t.Fatalf("streamed %d bytes of %d, exit %+v", len(out), n, exit)
		}
		res := c.exec(id, api.ExecRequest{Cmd: fmt.Sprintf("head -c %d /dev/zero; echo done >&2", n), MaxOutput: 1 << 20})
		if len(res.Stdout) != 1<<20 || !res.StdoutTruncated || res.Stderr != "done\n" {
			t.Fatalf("buffered: %d bytes, truncated %v, stderr %q", len(res.Stdout), res.StdoutTruncated, res.Stderr)
		}
	})
	t.Run("concurrent execs do not mix", func(t *testing.T) {
		errs := make(chan error, 16)
		for i := range 16 {
			go func() {
				var res api.ExecResult
				r := c.do("POST", sbPath(id, "/exec"), api.ExecRequest{Cmd: fmt.Sprintf("for j in 1 2 3; do echo %d; done; exit %d", i, i)})
				err := json.Unmarshal(r.Body, &res)
				if err == nil && (res.Stdout != strings.Repeat(fmt.Sprintf("%d\n", i), 3) || code(res) != fmt.Sprint(i)) {
					err = fmt.Errorf("exec %d got %+v", i, res)
				}
				errs <- err
			}()
		}
		for range 16 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	})
	t.Run("the process is in the table", func(t *testing.T) {
		r := c.do("POST", sbPath(id, "/exec/stream"), api.ExecRequest{Cmd: "echo tagged", Tag: "stream-tag"})
		evs := readEvents(t, bytes.NewReader(r.Body), false)
		var p api.Process
		c.mustJSON("GET", sbPath(id, "/processes/stream-tag"), nil, 200, &p)
		if p.Id != evs[0].ProcessId || p.Running || p.Exit == nil || *p.Exit.ExitCode != 0 || p.Cmd != "echo tagged" {
			t.Fatalf("process %+v, stream started %+v", p, evs[0])
		}
	})
}

// wsDial opens a WebSocket to path on c's daemon.
func wsDial(t testing.TB, c *client, path string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := http.Header{}
	if c.key != "" {
		h.Set("Authorization", "Bearer "+c.key)
	}
	ws, res, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(c.base, "http")+path,
		&websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: h})
	if err != nil {
		status := 0
		if res != nil {
			status = res.StatusCode
		}
		t.Fatalf("dial %s: %d %v", path, status, err)
	}
	ws.SetReadLimit(16 << 20)
	t.Cleanup(func() { ws.CloseNow() })
	return ws
}

func wsSend(t testing.TB, ws *websocket.Conn, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	if err := ws.Write(context.Background(), websocket.MessageText, b); err != nil {
		t.Fatalf("ws write: %v", err)
	}
}

// wsEvent reads the next text frame as an ExecEvent.
func wsEvent(t testing.TB, ws *websocket.Conn) api.ExecEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	typ, b, err := ws.Read(ctx)
	if err != nil {
		t.Fatalf("ws read: %v", err)
	}
	if typ != websocket.MessageText {
		t.Fatalf("a binary frame where an event was due: %q", b)
	}
	var ev api.ExecEvent
	if err := json.Unmarshal(b, &ev); err != nil {
		t.Fatalf("event %q: %v", b, err)
	}
	return ev
}

func TestExecWebSocket(t *testing.T) {
	t.Parallel()
	d := shared(t)
	tc, _ := newTenant(t, d, "ws-tenant")
	for name, c := range map[string]*client{"unix": local(t, d), "tcp": tc} {
		t.Run(name, func(t *testing.T) {
			id := newSandbox(t, c, api.CreateSandboxRequest{}).Id
			ws := wsDial(t, c, sbPath(id, "/exec/ws"))
			wsSend(t, ws, api.ExecRequest{Cmd: "while read l; do echo got-$l; echo err-$l >&2; done; exit 4", Tag: "ws"})
			if ev := wsEvent(t, ws); ev.Type != api.ExecEventTypeStart || ev.ProcessId == "" {
				t.Fatalf("first event %+v", ev)
			}
			var out, errs strings.Builder
			seq := int64(0)
			collect := func(until string) {
				for !strings.Contains(out.String(), until) {
					ev := wsEvent(t, ws)
					if ev.Type != api.ExecEventTypeOutput || ev.Seq != seq {
						t.Fatalf("event %+v, want output %d", ev, seq)
					}
					seq++
					if ev.Stream == api.Stderr {
						errs.Write(ev.Data)
					} else {
						out.Write(ev.Data)
					}
				}
			}
			// Round trips: each line in, its answer out, before the next.
			for _, l := range []string{"one", "two"} {
				wsSend(t, ws, api.StreamInput{Type: api.Stdin, Data: []byte(l + "\n")})
				collect("got-" + l + "\n")
			}
			wsSend(t, ws, api.StreamInput{Type: api.StdinClose})
			var exit api.ExecEvent
			for {
				ev := wsEvent(t, ws)
				if ev.Type == api.ExecEventTypeExit {
					exit = ev
					break
				}
				if ev.Stream == api.Stderr {
					errs.Write(ev.Data)
				}
				seq++
			}
			if exit.ExitCode == nil || *exit.ExitCode != 4 || exit.Seq != seq || !strings.Contains(errs.String(), "err-two") {
				t.Fatalf("exit %+v (seq %d), stderr %q", exit, seq, errs.String())
			}
			if _, _, err := ws.Read(context.Background()); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("after the exit: %v", err)
			}
			// A signal over the socket.
			ws = wsDial(t, c, sbPath(id, "/exec/ws"))
			wsSend(t, ws, api.ExecRequest{Cmd: "echo ready; sleep 100"})
			wsEvent(t, ws) // start
			if ev := wsEvent(t, ws); string(ev.Data) != "ready\n" {
				t.Fatalf("%+v", ev)
			}
			wsSend(t, ws, api.StreamInput{Type: api.Signal, Signal: "TERM"})
			if ev := wsEvent(t, ws); ev.Type != api.ExecEventTypeExit || ev.ExitCode != nil || ev.Signal == "" {
				t.Fatalf("after SIGTERM: %+v", ev)
			}
			// Stdin in the first message is the command's first input.
			ws = wsDial(t, c, sbPath(id, "/exec/ws"))
			wsSend(t, ws, api.ExecRequest{Cmd: "head -n 2", Stdin: "first\n"})
			wsEvent(t, ws) // start
			wsSend(t, ws, api.StreamInput{Type: api.Stdin, Data: []byte("second\n")})
			var got strings.Builder
			for {
				ev := wsEvent(t, ws)
				got.Write(ev.Data)
				if ev.Type == api.ExecEventTypeExit {
					break
				}
			}
			if got.String() != "first\nsecond\n" {
				t.Fatalf("stdin from the first message, then a frame: %q", got.String())
			}
			// A bad first message is an error event and a policy close.
			for _, first := range []map[string]any{{"cmd": ""}, {"cmd": "true", "bogus": 1}, {"cmd": "a\x00b"}, {"cmd": "true", "timeout": -1}} {
				ws = wsDial(t, c, sbPath(id, "/exec/ws"))
				wsSend(t, ws, first)
				if ev := wsEvent(t, ws); ev.Type != api.ExecEventTypeError || ev.Error == nil || ev.Error.Code != "invalid_argument" {
					t.Fatalf("bad request %v: %+v", first, ev)
				}
				if _, _, err := ws.Read(context.Background()); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
					t.Fatalf("after a bad request: %v", err)
				}
			}
			// Hanging up kills the foreground command.
			ws = wsDial(t, c, sbPath(id, "/exec/ws"))
			wsSend(t, ws, api.ExecRequest{Cmd: "sleep 100", Tag: "ws-hangup"})
			wsEvent(t, ws)
			ws.CloseNow()
			waitFor(t, "the hung-up command to die", 5*time.Second, func() bool {
				var p api.Process
				c.mustJSON("GET", sbPath(id, "/processes/ws-hangup"), nil, 200, &p)
				return !p.Running && p.Exit != nil && p.Exit.Killed
			})
		})
	}
}

// streamEvents GETs a process's output.
func streamEvents(t testing.TB, c *client, id, proc, query string) []api.ExecEvent {
	t.Helper()
	r := c.do("GET", sbPath(id, "/processes/"+proc+"/output"+query), nil)
	if r.Status != 200 {
		t.Fatalf("output %s%s: %s", proc, query, r)
	}
	return readEvents(t, bytes.NewReader(r.Body), false)
}

func TestProcesses(t *testing.T) {
	t.Parallel()
	d := shared(t)
	c := local(t, d)
	id := newSandbox(t, c, api.CreateSandboxRequest{}).Id

	var p api.Process
	c.mustJSON("POST", sbPath(id, "/processes"), api.StartProcessRequest{
		Cmd: "for i in 1 2 3 4; do echo line$i; sleep 0.02; done; while read l; do echo in-$l; done; exit 5", Tag: "worker", Stdin: true}, 201, &p)
	if !p.Running || p.Tag != "worker" || p.Pid <= 0 || p.Id == "" {
		t.Fatalf("started %+v", p)
	}
	// Listed, and found by id and by tag.
	var pl api.ProcessList
	c.mustJSON("GET", sbPath(id, "/processes"), nil, 200, &pl)
	found := false
	for _, x := range pl.Processes {
		found = found || x.Id == p.Id
	}
	if !found {
		t.Fatalf("process %s not in %+v", p.Id, pl)
	}
	var byID, byTag api.Process
	c.mustJSON("GET", sbPath(id, "/processes/"+p.Id), nil, 200, &byID)
	c.mustJSON("GET", sbPath(id, "/processes/worker"), nil, 200, &byTag)
	if byID.Id != p.Id || byTag.Id != p.Id {
		t.Fatalf("by id %+v, by tag %+v", byID, byTag)
	}
	// Wait with a short timeout: 504, and the process runs on.
	c.wantErr("POST", sbPath(id, "/processes/worker/wait?timeout=0.2"), nil, "deadline_exceeded")
	c.mustJSON("GET", sbPath(id, "/processes/worker"), nil, 200, &byTag)
	if !byTag.Running {
		t.Fatalf("the wait timeout stopped the process: %+v", byTag)
	}
	// Output so far, without follow: ends without an exit event.
	waitFor(t, "four lines", 5*time.Second, func() bool {
		c.mustJSON("GET", sbPath(id, "/processes/worker"), nil, 200, &byTag)
		return byTag.NextSeq >= 1 && strings.Count(outputOf(streamEvents(t, c, id, "worker", "")), "\n") == 4
	})
	evs := streamEvents(t, c, id, "worker", "")
	if evs[0].Type != api.ExecEventTypeStart || evs[len(evs)-1].Type == api.ExecEventTypeExit {
		t.Fatalf("output without follow of a running process: %+v", evs)
	}
	// From a later seq: exactly the suffix.
	if n := len(evs) - 1; n >= 2 {
		from := evs[2].Seq
		tail := streamEvents(t, c, id, p.Id, fmt.Sprintf("?from_seq=%d", from))
		if len(tail) != len(evs)-1 || tail[1].Seq != from || !bytes.Equal(tail[1].Data, evs[2].Data) {
			t.Fatalf("from_seq %d: %+v, all: %+v", from, tail, evs)
		}
	}
	// From past the end: just the start event.
	if tail := streamEvents(t, c, id, "worker", "?from_seq=1000"); len(tail) != 1 {
		t.Fatalf("from_seq past the end: %+v", tail)
	}
	// Follow in the background while stdin feeds it and closes it.
	followed := make(chan []api.ExecEvent, 1)
	go func() {
		req := c.request(context.Background(), "GET", sbPath(id, "/processes/worker/output?follow=true"), nil)
		res, err := c.hc.Do(req)
		if err != nil {
			followed <- nil
			return
		}
		defer res.Body.Close()
		followed <- readEvents(t, res.Body, false)
	}()
	c.mustJSON("POST", sbPath(id, "/processes/worker/stdin"), "a\nb\n", 204, nil)
	c.mustJSON("POST", sbPath(id, "/processes/"+p.Id+"/stdin?close=true"), "c\n", 204, nil)
	var waited api.Process
	c.mustJSON("POST", sbPath(id, "/processes/worker/wait?timeout=10"), nil, 200, &waited)
	if waited.Running || waited.Exit == nil || waited.Exit.ExitCode == nil || *waited.Exit.ExitCode != 5 {
		t.Fatalf("waited %+v %+v", waited, waited.Exit)
	}
	var all []api.ExecEvent
	select {
	case all = <-followed:
	case <-time.After(10 * time.Second):
		t.Fatal("the followed output did not end with the process")
	}
	out, _, exit := checkStream(t, all, 0)
	if out != "line1\nline2\nline3\nline4\nin-a\nin-b\nin-c\n" || *exit.ExitCode != 5 {
		t.Fatalf("followed %q, exit %+v", out, exit)
	}
	// After the exit, output without follow includes the exit event.
	out2, _, _ := checkStream(t, streamEvents(t, c, id, "worker", ""), 0)
	if out2 != out {
		t.Fatalf("replay %q, live %q", out2, out)
	}
	// SSE output.
	r := c.do("GET", sbPath(id, "/processes/worker/output"), nil, "Accept", "text/event-stream")
	if out3, _, _ := checkStream(t, readEvents(t, bytes.NewReader(r.Body), true), 0); out3 != out {
		t.Fatalf("SSE replay %q", out3)
	}
	// A signal ends a process; its status says so; wait returns at once.
	var sl api.Process
	c.mustJSON("POST", sbPath(id, "/processes"), api.StartProcessRequest{Cmd: "sleep 1000", Tag: "sleeper"}, 201, &sl)
	c.mustJSON("POST", sbPath(id, "/processes/sleeper/signal"), api.SignalRequest{Signal: "SIGTERM"}, 204, nil)
	c.mustJSON("POST", sbPath(id, "/processes/sleeper/wait"), nil, 200, &sl)
	if sl.Running || sl.Exit == nil || sl.Exit.ExitCode != nil || sl.Exit.Signal == "" {
		t.Fatalf("after SIGTERM: %+v %+v", sl, sl.Exit)
	}
	// A newer process with the same tag wins.
	var again api.Process
	c.mustJSON("POST", sbPath(id, "/processes"), api.StartProcessRequest{Cmd: "sleep 1000", Tag: "sleeper"}, 201, &again)
	c.mustJSON("GET", sbPath(id, "/processes/sleeper"), nil, 200, &sl)
	if sl.Id != again.Id || !sl.Running {
		t.Fatalf("tag resolves to %+v, want the newest %s", sl, again.Id)
	}
	// A process timeout kills it.
	var timed api.Process
	c.mustJSON("POST", sbPath(id, "/processes"), api.StartProcessRequest{Cmd: "sleep 1000", Timeout: 0.2}, 201, &timed)
	c.mustJSON("POST", sbPath(id, "/processes/"+timed.Id+"/wait?timeout=10"), nil, 200, &timed)
	if timed.Exit == nil || !timed.Exit.TimedOut {
		t.Fatalf("timed process %+v", timed.Exit)
	}
}

func outputOf(evs []api.ExecEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		b.Write(ev.Data)
	}
	return b.String()
}

// termRead collects terminal output until it contains want.
func termRead(t testing.TB, ws *websocket.Conn, want string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got strings.Builder
	for !strings.Contains(got.String(), want) {
		typ, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("terminal: waiting for %q: %v; got %q", want, err, got.String())
		}
		if typ == websocket.MessageBinary {
			got.Write(b)
		}
	}
	return got.String()
}

func TestTerminals(t *testing.T) {
	t.Parallel()
	d := shared(t)
	c := local(t, d)
	id := newSandbox(t, c, api.CreateSandboxRequest{}).Id
	var term api.Process
	c.mustJSON("POST", sbPath(id, "/terminals"), api.OpenTerminalRequest{Tag: "shell", Rows: 30, Cols: 100}, 201, &term)
	if !term.Tty || !term.Running {
		t.Fatalf("terminal %+v", term)
	}
	ws := wsDial(t, c, sbPath(id, "/terminals/shell/ws"))
	if ev := wsEvent(t, ws); ev.Type != api.ExecEventTypeStart || ev.ProcessId != term.Id {
		t.Fatalf("first frame %+v", ev)
	}
	type1 := func(ws *websocket.Conn, s string) {
		if err := ws.Write(context.Background(), websocket.MessageBinary, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	type1(ws, "echo mark-$((6*7)); stty size\r")
	termRead(t, ws, "30 100")
	if out := outputOf(streamEvents(t, c, id, "shell", "")); !strings.Contains(out, "mark-42") {
		t.Fatalf("terminal output %q", out)
	}
	// Resize over the socket and over the endpoint.
	wsSend(t, ws, api.StreamInput{Type: api.Resize, Rows: 40, Cols: 120})
	time.Sleep(50 * time.Millisecond)
	type1(ws, "stty size\r")
	termRead(t, ws, "40 120")
	c.mustJSON("POST", sbPath(id, "/terminals/shell/resize"), api.ResizeRequest{Rows: 20, Cols: 60}, 204, nil)
	type1(ws, "stty size\r")
	termRead(t, ws, "20 60")
	// Detach: the shell runs on. Re-attach: the scrollback replays.
	ws.Close(websocket.StatusNormalClosure, "")
	time.Sleep(100 * time.Millisecond)
	var p api.Process
	c.mustJSON("GET", sbPath(id, "/processes/shell"), nil, 200, &p)
	if !p.Running {
		t.Fatalf("detaching ended the terminal: %+v", p)
	}
	ws = wsDial(t, c, sbPath(id, "/terminals/"+term.Id+"/ws"))
	wsEvent(t, ws)
	termRead(t, ws, "mark-42")
	// A small scrollback replays only the tail.
	ws2 := wsDial(t, c, sbPath(id, "/terminals/shell/ws?scrollback=8"))
	wsEvent(t, ws2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	typ, b, err := ws2.Read(ctx)
	cancel()
	if err != nil || typ != websocket.MessageBinary || len(b) > 8 {
		t.Fatalf("scrollback=8 replayed %d bytes %q (%v)", len(b), b, err)
	}
	ws2.CloseNow()
	// Typing exit ends it: the exit event, then a normal close.
	type1(ws, "exit 3\r")
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		typ, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("no exit event: %v", err)
		}
		if typ != websocket.MessageText {
			continue
		}
		var ev api.ExecEvent
		_ = json.Unmarshal(b, &ev)
		if ev.Type == api.ExecEventTypeExit {
			if ev.ExitCode == nil || *ev.ExitCode != 3 {
				t.Fatalf("exit %+v", ev)
			}
			break
		}
	}
	// An exited terminal can be replayed but not resized.
	c.mustJSON("POST", sbPath(id, "/processes/shell/wait?timeout=5"), nil, 200, &p)
	if p.Running {
		t.Fatalf("after exit: %+v", p)
	}
}

// A resize through the endpoint is in effect when it answers: input sent
// right after it, on another connection, sees the new size, every time.
func TestTerminalResizeOrder(t *testing.T) {
	t.Parallel()
	c := local(t, shared(t))
	id := newSandbox(t, c, api.CreateSandboxRequest{}).Id
	c.mustJSON("POST", sbPath(id, "/terminals"), api.OpenTerminalRequest{Tag: "order", Rows: 24, Cols: 80}, 201, nil)
	ws := wsDial(t, c, sbPath(id, "/terminals/order/ws"))
	wsEvent(t, ws) // start
	for i := range 15 {
		rows, cols := 20+i, 60+2*i
		c.mustJSON("POST", sbPath(id, "/terminals/order/resize"), api.ResizeRequest{Rows: rows, Cols: cols}, 204, nil)
		if err := ws.Write(context.Background(), websocket.MessageBinary, []byte("stty size\r")); err != nil {
			t.Fatal(err)
		}
		termRead(t, ws, fmt.Sprintf("%d %d\r", rows, cols))
	}
}
