package mcp_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hutch-dev/hutch/internal/daemon"
	"github.com/hutch-dev/hutch/internal/daemon/daemontest"
	hutchmcp "github.com/hutch-dev/hutch/internal/mcp"
	"github.com/hutch-dev/hutch/internal/netpolicy/gateway"
	"github.com/hutch-dev/hutch/internal/netpolicy/nettest"
	"github.com/hutch-dev/hutch/internal/server"
	hutch "github.com/hutch-dev/hutch/sdk"
)

func connect(t *testing.T, ctx context.Context, tr mcp.Transport) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "hutch-test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// The schemas need no daemon: an unreachable client is never called.
func TestToolSchemas(t *testing.T) {
	t.Parallel()
	c, err := hutch.New("unix:///nonexistent/hutch.sock", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := hutchmcp.New(c, "test", nil).Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs := connect(t, ctx, ct)
	checkTools(t, ctx, cs)
	tmpl, err := cs.ListResourceTemplates(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tmpl.ResourceTemplates) != 1 || tmpl.ResourceTemplates[0].URITemplate != "hutch://sandboxes/{id}/files/{+path}" {
		t.Fatalf("resource templates: %+v", tmpl.ResourceTemplates)
	}
	// A daemon that cannot be reached is a tool error with its code.
	msg := callErr(t, ctx, cs, "list_sandboxes", map[string]any{})
	if !strings.HasPrefix(msg, "unavailable: ") {
		t.Fatalf("list with no daemon: %q", msg)
	}
}

// Over stdio: the real binary's `hutch mcp`, started as a client would,
// against a real daemon's socket.
func TestStdio(t *testing.T) {
	t.Parallel()
	d := daemontest.Start(t)
	bin := hutchBinary(t)
	ctx := context.Background()
	cmd := exec.Command(bin, "mcp", "--host", "unix://"+d.Socket)
	cs := connect(t, ctx, &mcp.CommandTransport{Command: cmd})
	checkTools(t, ctx, cs)
	scenario(t, ctx, cs)
}

// Over streamable HTTP at /mcp, as a tenant (API key on TCP) and as the
// trusted local socket.
func TestHTTP(t *testing.T) {
	t.Parallel()
	d := daemontest.Start(t)
	ctx := context.Background()
	_, key := makeKey(t, d, "a")
	cs := connect(t, ctx, httpTransport(d, key))
	checkTools(t, ctx, cs)
	scenario(t, ctx, cs)

	sock := connect(t, ctx, unixTransport(d.Socket))
	id := create(t, ctx, sock)
	res := call[struct{ Stdout string }](t, ctx, sock, "run_command", map[string]any{"sandbox_id": id, "cmd": "echo via socket"})
	if res.Stdout != "via socket\n" {
		t.Fatalf("socket run: %q", res.Stdout)
	}
}

// Two API keys are two tenants: neither sees, runs in, reads or destroys
// the other's sandbox through MCP, while the trusted socket sees both.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	d := daemontest.Start(t)
	ctx := context.Background()
	_, keyA := makeKey(t, d, "a")
	_, keyB := makeKey(t, d, "b")
	a := connect(t, ctx, httpTransport(d, keyA))
	b := connect(t, ctx, httpTransport(d, keyB))
	idA := create(t, ctx, a)
	idB := create(t, ctx, b)
	call[struct{ Path string }](t, ctx, a, "write_file", map[string]any{"sandbox_id": idA, "path": "secret.txt", "content": "a's"})

	if ids := listIDs(t, ctx, b); len(ids) != 1 || ids[0] != idB {
		t.Fatalf("b lists %v, want only %s", ids, idB)
	}
	if ids := listIDs(t, ctx, a); len(ids) != 1 || ids[0] != idA {
		t.Fatalf("a lists %v, want only %s", ids, idA)
	}
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"run_command", map[string]any{"sandbox_id": idA, "cmd": "true"}},
		{"read_file", map[string]any{"sandbox_id": idA, "path": "secret.txt"}},
		{"write_file", map[string]any{"sandbox_id": idA, "path": "x", "content": "b was here"}},
		{"list_files", map[string]any{"sandbox_id": idA}},
		{"start_process", map[string]any{"sandbox_id": idA, "cmd": "sleep 1"}},
		{"destroy_sandbox", map[string]any{"sandbox_id": idA}},
	} {
		if msg := callErr(t, ctx, b, c.tool, c.args); !strings.HasPrefix(msg, "not_found: ") {
			t.Errorf("b %s on a's sandbox: %q, want not_found", c.tool, msg)
		}
	}
	if _, err := b.ReadResource(ctx, &mcp.ReadResourceParams{URI: "hutch://sandboxes/" + idA + "/files/workspace/secret.txt"}); err == nil {
		t.Error("b read a's file as a resource")
	}
	// A's sandbox and file are untouched.
	f := call[struct{ Content string }](t, ctx, a, "read_file", map[string]any{"sandbox_id": idA, "path": "secret.txt"})
	if f.Content != "a's" {
		t.Fatalf("a's file: %q", f.Content)
	}
	sock := connect(t, ctx, unixTransport(d.Socket))
	if ids := listIDs(t, ctx, sock); len(ids) != 2 {
		t.Fatalf("the socket lists %v, want both", ids)
	}
	// Without a key, /mcp on TCP is refused like the rest of the API.
	c := mcp.NewClient(&mcp.Implementation{Name: "nokey", Version: "1"}, nil)
	if cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + d.TCPAddr + "/mcp",
		MaxRetries: -1}, nil); err == nil {
		cs.Close()
		t.Fatal("connected to /mcp over TCP without an API key")
	}
}

func makeKey(t *testing.T, d *daemon.Daemon, tenant string) (string, string) {
	t.Helper()
	k, secret, err := d.Store.CreateKey(context.Background(), "mcp-"+tenant, tenant, nil)
	if err != nil {
		t.Fatal(err)
	}
	return k.Tenant, secret
}

func httpTransport(d *daemon.Daemon, key string) mcp.Transport {
	return &mcp.StreamableClientTransport{Endpoint: "http://" + d.TCPAddr + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{key: key, next: http.DefaultTransport}}, MaxRetries: -1}
}

func unixTransport(sock string) mcp.Transport {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	return &mcp.StreamableClientTransport{Endpoint: "http://hutch/mcp", HTTPClient: &http.Client{Transport: tr},
		MaxRetries: -1}
}

// call calls a tool that must succeed and decodes its structured result.
func call[T any](t *testing.T, ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) T {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if res.IsError {
		t.Fatalf("%s(%v): tool error %s", tool, args, text(res))
	}
	var out T
	raw, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s: structured content %s: %v", tool, raw, err)
	}
	// The text content is the same JSON, for clients that read only text.
	var fromText T
	if err := json.Unmarshal([]byte(text(res)), &fromText); err != nil {
		t.Fatalf("%s: text content %q: %v", tool, text(res), err)
	}
	return out
}

// callErr calls a tool that must fail as a tool error and returns its text.
func callErr(t *testing.T, ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) string {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error %v, want a tool error", tool, err)
	}
	if !res.IsError {
		t.Fatalf("%s(%v) succeeded: %s", tool, args, text(res))
	}
	return text(res)
}

func text(res *mcp.CallToolResult) string {
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			return tc.Text
		}
	}
	return ""
}

func create(t *testing.T, ctx context.Context, cs *mcp.ClientSession) string {
	t.Helper()
	sb := call[struct{ ID, State string }](t, ctx, cs, "create_sandbox", map[string]any{"env": map[string]any{"BASE": "yes"}})
	if sb.ID == "" || sb.State != "running" {
		t.Fatalf("created %+v", sb)
	}
	return sb.ID
}

func listIDs(t *testing.T, ctx context.Context, cs *mcp.ClientSession) []string {
	t.Helper()
	l := call[struct{ Sandboxes []struct{ ID, State string } }](t, ctx, cs, "list_sandboxes", map[string]any{"state": "running"})
	var ids []string
	for _, s := range l.Sandboxes {
		ids = append(ids, s.ID)
	}
	return ids
}

type runResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode *int   `json:"exit_code"`
	TimedOut bool   `json:"timed_out"`
}

type outputResult struct {
	Stdout   string `json:"stdout"`
	NextSeq  int64  `json:"next_seq"`
	Running  bool   `json:"running"`
	ExitCode *int   `json:"exit_code"`
	Signal   string `json:"signal"`
}

// scenario is one agent's session: create → run (env, cwd, timeout) →
// files (and a file resource) → a background process → destroy, plus the
// error cases.
func scenario(t *testing.T, ctx context.Context, cs *mcp.ClientSession) {
	id := create(t, ctx, cs)
	r := call[runResult](t, ctx, cs, "run_command", map[string]any{"sandbox_id": id,
		"cmd": "echo $FOO $BASE; pwd; echo oops >&2; exit 3", "env": map[string]any{"FOO": "bar"}, "cwd": "/tmp"})
	if r.Stdout != "bar yes\n/tmp\n" || r.Stderr != "oops\n" || r.ExitCode == nil || *r.ExitCode != 3 || r.TimedOut {
		t.Fatalf("run: %+v", r)
	}
	start := time.Now()
	r = call[runResult](t, ctx, cs, "run_command", map[string]any{"sandbox_id": id, "cmd": "echo before; sleep 30",
		"timeout_seconds": 0.5})
	if !r.TimedOut || r.ExitCode != nil || r.Stdout != "before\n" || time.Since(start) > 10*time.Second {
		t.Fatalf("timeout run: %+v after %v", r, time.Since(start))
	}
	r = call[runResult](t, ctx, cs, "run_command", map[string]any{"sandbox_id": id, "cmd": "cat", "stdin": "fed"})
	if r.Stdout != "fed" {
		t.Fatalf("stdin run: %+v", r)
	}
	files(t, ctx, cs, id)
	processes(t, ctx, cs, id)

	if msg := callErr(t, ctx, cs, "run_command", map[string]any{"sandbox_id": "no-such-sandbox", "cmd": "true"}); !strings.HasPrefix(msg, "not_found: ") {
		t.Fatalf("unknown sandbox: %q", msg)
	}
	if msg := callErr(t, ctx, cs, "run_command", map[string]any{"sandbox_id": id}); !strings.HasPrefix(msg, "invalid_argument: ") {
		t.Fatalf("no cmd: %q", msg)
	}
	if msg := callErr(t, ctx, cs, "run_command", map[string]any{"sandbox_id": id, "cmd": "true", "shell": "bash"}); !strings.HasPrefix(msg, "invalid_argument: ") {
		t.Fatalf("unknown argument: %q", msg)
	}
	if msg := callErr(t, ctx, cs, "write_file", map[string]any{"sandbox_id": id, "path": "m", "content": "", "mode": "9z"}); !strings.HasPrefix(msg, "invalid_argument: ") {
		t.Fatalf("bad mode: %q", msg)
	}
	d := call[struct{ Destroyed bool }](t, ctx, cs, "destroy_sandbox", map[string]any{"sandbox_id": id})
	if !d.Destroyed {
		t.Fatal("not destroyed")
	}
	call[struct{ Destroyed bool }](t, ctx, cs, "destroy_sandbox", map[string]any{"sandbox_id": id}) // again: fine
	if msg := callErr(t, ctx, cs, "run_command", map[string]any{"sandbox_id": id, "cmd": "true"}); msg == "" {
		t.Fatal("run in a destroyed sandbox: no message")
	}
}

func files(t *testing.T, ctx context.Context, cs *mcp.ClientSession, id string) {
	call[struct{ Size int }](t, ctx, cs, "write_file", map[string]any{"sandbox_id": id, "path": "notes/a.txt", "content": "hello\n"})
	bin := []byte{0, 1, 2, 0xff, 0xfe}
	call[struct{ Size int }](t, ctx, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/workspace/notes/b.bin",
		"content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64", "mode": "0600"})
	type file struct{ Content, Encoding string }
	if f := call[file](t, ctx, cs, "read_file", map[string]any{"sandbox_id": id, "path": "notes/a.txt"}); f.Content != "hello\n" || f.Encoding != "utf-8" {
		t.Fatalf("read a.txt: %+v", f)
	}
	if f := call[file](t, ctx, cs, "read_file", map[string]any{"sandbox_id": id, "path": "notes/b.bin"}); f.Encoding != "base64" || f.Content != base64.StdEncoding.EncodeToString(bin) {
		t.Fatalf("read b.bin: %+v", f)
	}
	l := call[struct {
		Files []struct{ Name, Type, Mode string }
	}](t, ctx, cs, "list_files", map[string]any{"sandbox_id": id, "path": "notes"})
	if len(l.Files) != 2 || l.Files[0].Name != "a.txt" || l.Files[1].Name != "b.bin" || l.Files[1].Mode != "0600" || l.Files[0].Type != "file" {
		t.Fatalf("list: %+v", l.Files)
	}
	rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "hutch://sandboxes/" + id + "/files/workspace/notes/a.txt"})
	if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "hello\n" {
		t.Fatalf("resource: %+v, %v", rr, err)
	}
	rr, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "hutch://sandboxes/" + id + "/files/workspace/notes/b.bin"})
	if err != nil || len(rr.Contents) != 1 || string(rr.Contents[0].Blob) != string(bin) {
		t.Fatalf("binary resource: %+v, %v", rr, err)
	}
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "hutch://sandboxes/" + id + "/files/workspace/nope"}); err == nil {
		t.Fatal("a missing file's resource was read")
	}
	call[struct{ Removed bool }](t, ctx, cs, "remove_file", map[string]any{"sandbox_id": id, "path": "notes/a.txt"})
	if msg := callErr(t, ctx, cs, "read_file", map[string]any{"sandbox_id": id, "path": "notes/a.txt"}); !strings.HasPrefix(msg, "not_found: ") {
		t.Fatalf("read removed: %q", msg)
	}
	if msg := callErr(t, ctx, cs, "remove_file", map[string]any{"sandbox_id": id, "path": "notes"}); msg == "" {
		t.Fatal("removing a non-empty directory without recursive: no message")
	}
	call[struct{ Removed bool }](t, ctx, cs, "remove_file", map[string]any{"sandbox_id": id, "path": "notes", "recursive": true})
	call[struct{ Removed bool }](t, ctx, cs, "remove_file", map[string]any{"sandbox_id": id, "path": "notes", "force": true})
}

func processes(t *testing.T, ctx context.Context, cs *mcp.ClientSession, id string) {
	p := call[struct {
		ProcessID string `json:"process_id"`
		PID       int
	}](t, ctx, cs, "start_process", map[string]any{"sandbox_id": id, "cmd": "echo one; echo two; sleep 300", "tag": "bg",
		"env": map[string]any{"X": "1"}})
	if p.ProcessID == "" || p.PID == 0 {
		t.Fatalf("start: %+v", p)
	}
	var out outputResult
	deadline := time.Now().Add(10 * time.Second)
	var seen string
	for seq := int64(0); !strings.Contains(seen, "two") && time.Now().Before(deadline); seq = out.NextSeq {
		out = call[outputResult](t, ctx, cs, "read_process_output", map[string]any{"sandbox_id": id, "process_id": "bg", "from_seq": seq})
		seen += out.Stdout
		if !out.Running {
			t.Fatalf("exited early: %+v", out)
		}
	}
	if seen != "one\ntwo\n" {
		t.Fatalf("output: %q", seen)
	}
	// Reading from next_seq again gives nothing new, also after waiting
	// for an exit that does not come.
	again := call[outputResult](t, ctx, cs, "read_process_output", map[string]any{"sandbox_id": id, "process_id": p.ProcessID, "from_seq": out.NextSeq})
	if again.Stdout != "" || again.NextSeq != out.NextSeq || !again.Running {
		t.Fatalf("re-read: %+v after %+v", again, out)
	}
	start := time.Now()
	again = call[outputResult](t, ctx, cs, "read_process_output", map[string]any{"sandbox_id": id, "process_id": p.ProcessID,
		"from_seq": out.NextSeq, "wait_seconds": 0.3})
	if again.Stdout != "" || again.NextSeq != out.NextSeq || !again.Running || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("waited re-read: %+v after %v", again, time.Since(start))
	}
	if msg := callErr(t, ctx, cs, "read_process_output", map[string]any{"sandbox_id": id, "process_id": p.ProcessID,
		"wait_seconds": 301}); !strings.HasPrefix(msg, "invalid_argument: ") {
		t.Fatalf("wait too long: %q", msg)
	}
	call[struct{ Signal string }](t, ctx, cs, "kill_process", map[string]any{"sandbox_id": id, "process_id": p.ProcessID})
	end := call[outputResult](t, ctx, cs, "read_process_output", map[string]any{"sandbox_id": id, "process_id": p.ProcessID,
		"from_seq": out.NextSeq, "wait_seconds": 10})
	if end.Running || end.Signal != "SIGKILL" || end.ExitCode != nil {
		t.Fatalf("after kill: %+v", end)
	}
	if msg := callErr(t, ctx, cs, "kill_process", map[string]any{"sandbox_id": id, "process_id": "nope"}); !strings.HasPrefix(msg, "not_found: ") {
		t.Fatalf("kill unknown: %q", msg)
	}
}

// The in-process transport fails closed: served where nothing has
// authenticated the request (not behind Server.Mount), every call is
// unauthenticated rather than trusted.
func TestHandlerWithoutCaller(t *testing.T) {
	t.Parallel()
	srv := server.New(server.Config{})
	hs := httptest.NewServer(hutchmcp.Handler(srv.InProcess, "test"))
	defer hs.Close()
	ctx := context.Background()
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	cs := connect(t, ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL, HTTPClient: hc, MaxRetries: -1})
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"list_sandboxes", map[string]any{}},
		{"create_sandbox", map[string]any{}},
		{"run_command", map[string]any{"sandbox_id": "x", "cmd": "true"}},
	} {
		if msg := callErr(t, ctx, cs, c.tool, c.args); !strings.HasPrefix(msg, "unauthenticated: ") {
			t.Errorf("%s without a caller: %q", c.tool, msg)
		}
	}
	cs.Close()
}

// Network through MCP: create with an allow list and change it live on a
// daemon with networking; a bad rule and an unknown mode are tool errors
// with invalid_argument; a daemon without networking says so.
func TestNetworkTools(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nettest.NeedNetworking(t)
	d := daemontest.Start(t, func(c *daemon.Config) { c.Network = &gateway.Options{} })
	cs := connect(t, ctx, unixTransport(d.Socket))
	sb := call[struct{ ID, Network string }](t, ctx, cs, "create_sandbox",
		map[string]any{"allow": []string{"api.github.com", "*.npmjs.org:443", "203.0.113.0/24"}})
	if sb.Network != "allow-list" {
		t.Fatalf("created with network %q", sb.Network)
	}
	out := call[struct{ Stdout string }](t, ctx, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "cmd": "ls /sys/class/net"})
	if !strings.Contains(out.Stdout, "eth0") {
		t.Fatalf("interfaces: %q", out.Stdout)
	}
	got := call[struct {
		Network string
		Allow   []string
	}](t, ctx, cs, "set_network", map[string]any{"sandbox_id": sb.ID, "network": "allow-list", "allow": []string{"pypi.org:443,80"}})
	if got.Network != "allow-list" || len(got.Allow) != 1 || got.Allow[0] != "pypi.org:80,443" {
		t.Fatalf("set_network answered %+v", got)
	}
	if msg := callErr(t, ctx, cs, "set_network", map[string]any{"sandbox_id": sb.ID, "network": "allow-list", "allow": []string{"pypi.org:http"}}); !strings.HasPrefix(msg, "invalid_argument: ") {
		t.Fatalf("bad rule: %q", msg)
	}
	if msg := callErr(t, ctx, cs, "set_network", map[string]any{"sandbox_id": sb.ID, "network": "open"}); !strings.HasPrefix(msg, "invalid_argument: ") {
		t.Fatalf("bad mode: %q", msg)
	}
	call[struct{}](t, ctx, cs, "set_network", map[string]any{"sandbox_id": sb.ID, "network": "deny-all"})
	out = call[struct{ Stdout string }](t, ctx, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "cmd": "ls /sys/class/net"})
	if strings.TrimSpace(out.Stdout) != "lo" {
		t.Fatalf("after deny-all: %q", out.Stdout)
	}

	off := connect(t, ctx, unixTransport(daemontest.Start(t).Socket))
	if msg := callErr(t, ctx, off, "create_sandbox", map[string]any{"network": "allow-all"}); !strings.HasPrefix(msg, "failed_precondition: ") {
		t.Fatalf("allow-all without networking: %q", msg)
	}
}
