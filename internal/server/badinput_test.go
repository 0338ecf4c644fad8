package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/daemon"
)

// bad is one malformed request and the error code it must get.
type bad struct {
	name   string
	method string
	path   string // {id} is the sandbox
	body   any
	code   string
}

// runBad sends each request and checks its error; then the sandbox must
// still work and still hold its file.
func runBad(t *testing.T, c *client, id string, cases []bad) {
	t.Helper()
	for _, bc := range cases {
		r := c.do(bc.method, strings.ReplaceAll(bc.path, "{id}", id), bc.body)
		if r.Status != statusOfCode[bc.code] {
			t.Errorf("%s: got %s, want %d %s", bc.name, r, statusOfCode[bc.code], bc.code)
			continue
		}
		if e := r.apiErr(t); e.Code != bc.code || e.RequestId == "" || e.Message == "" {
			t.Errorf("%s: error body %s", bc.name, r.Body)
		}
	}
	healthy(t, c, id, "keep.txt", "precious")
}

func badFixture(t *testing.T) (*client, string) {
	d := shared(t)
	c := local(t, d)
	sb := newSandbox(t, c, api.CreateSandboxRequest{})
	c.mustJSON("PUT", sbPath(sb.Id, "/files?path=keep.txt"), "precious", 200, nil)
	return c, sb.Id
}

func TestBadJSONBodies(t *testing.T) {
	t.Parallel()
	c, id := badFixture(t)
	big := `{"labels":{"a":"` + strings.Repeat("x", 5<<20) + `"}}` // over even exec's 2 MiB + 2 x 1 MiB stdin
	var cases []bad
	// Every JSON-body endpoint refuses the same garbage the same way.
	for _, ep := range []struct{ method, path string }{
		{"POST", "/v1/sandboxes"},
		{"POST", "/v1/sandboxes/{id}/exec"},
		{"POST", "/v1/sandboxes/{id}/exec/stream"},
		{"POST", "/v1/sandboxes/{id}/processes"},
		{"POST", "/v1/sandboxes/{id}/processes/1/signal"},
		{"POST", "/v1/sandboxes/{id}/terminals"},
		{"POST", "/v1/sandboxes/{id}/terminals/1/resize"},
		{"POST", "/v1/sandboxes/{id}/files/mkdir"},
		{"POST", "/v1/sandboxes/{id}/files/rename"},
		{"PUT", "/v1/sandboxes/{id}/network"},
		{"POST", "/v1/sandboxes/{id}/ports"},
		{"POST", "/v1/keys"},
	} {
		for _, b := range []struct{ name, body, code string }{
			{"malformed", `{"cmd":`, "invalid_argument"},
			{"not JSON", `cmd=true`, "invalid_argument"},
			{"unknown field", `{"bogus":1}`, "invalid_argument"},
			{"trailing value", `{} {}`, "invalid_argument"},
			{"trailing garbage", `{}x`, "invalid_argument"},
			{"empty", ``, "invalid_argument"},
			{"whitespace", "  \n", "invalid_argument"},
			{"array", `[]`, "invalid_argument"},
			{"null", `null`, "invalid_argument"},
			{"string", `"true"`, "invalid_argument"},
			{"number", `42`, "invalid_argument"},
			{"wrong type", `{"cmd":42,"name":42,"path":42,"from":42,"signal":42,"rows":"x","env":[1]}`, "invalid_argument"},
			{"invalid UTF-16 escape", `{"cmd":"\ud800x","name":"\ud800"`, "invalid_argument"},
			{"over the body limit", big, "payload_too_large"},
		} {
			cases = append(cases, bad{ep.method + " " + ep.path + ": " + b.name, ep.method, ep.path, b.body, b.code})
		}
	}
	runBad(t, c, id, cases)
}

func TestBadCreateSandbox(t *testing.T) {
	t.Parallel()
	c, id := badFixture(t)
	runBad(t, c, id, []bad{
		{"negative timeout", "POST", "/v1/sandboxes", `{"timeout":-1}`, "invalid_argument"},
		{"fractional timeout", "POST", "/v1/sandboxes", `{"timeout":1.5}`, "invalid_argument"},
		{"huge timeout", "POST", "/v1/sandboxes", `{"timeout":1e30}`, "invalid_argument"},
		{"id with capitals", "POST", "/v1/sandboxes", `{"id":"Bad"}`, "invalid_argument"},
		{"id with a slash", "POST", "/v1/sandboxes", `{"id":"../../etc"}`, "invalid_argument"},
		{"id with a NUL", "POST", "/v1/sandboxes", `{"id":"a\u0000b"}`, "invalid_argument"},
		{"id with a space", "POST", "/v1/sandboxes", `{"id":"a b"}`, "invalid_argument"},
		{"id with a leading dash", "POST", "/v1/sandboxes", `{"id":"-a"}`, "invalid_argument"},
		{"id too long", "POST", "/v1/sandboxes", `{"id":"` + strings.Repeat("a", 64) + `"}`, "invalid_argument"},
		{"existing id", "POST", "/v1/sandboxes", `{"id":"` + id + `"}`, "already_exists"},
		{"tiny memory", "POST", "/v1/sandboxes", `{"limits":{"memory_mb":1}}`, "invalid_argument"},
		{"negative memory", "POST", "/v1/sandboxes", `{"limits":{"memory_mb":-1}}`, "invalid_argument"},
		{"tiny pids", "POST", "/v1/sandboxes", `{"limits":{"pids":2}}`, "invalid_argument"},
		{"tiny cpu", "POST", "/v1/sandboxes", `{"limits":{"cpu_millis":1}}`, "invalid_argument"},
		{"overflowing memory", "POST", "/v1/sandboxes", `{"limits":{"memory_mb":9223372036854775807}}`, "invalid_argument"},
		{"limits of the wrong type", "POST", "/v1/sandboxes", `{"limits":{"memory_mb":"1G"}}`, "invalid_argument"},
		{"unknown template", "POST", "/v1/sandboxes", `{"template":"python"}`, "not_found"},
		{"unknown base scheme", "POST", "/v1/sandboxes", `{"base":"ftp://x"}`, "invalid_argument"},
		{"missing base dir", "POST", "/v1/sandboxes", `{"base":"dir:/does/not/exist"}`, "not_found"},
		{"labels of the wrong type", "POST", "/v1/sandboxes", `{"labels":{"a":1}}`, "invalid_argument"},
		{"env with a NUL", "POST", "/v1/sandboxes", `{"env":{"A":"x\u0000y"}}`, "invalid_argument"},
		{"env key with =", "POST", "/v1/sandboxes", `{"env":{"A=B":"x"}}`, "invalid_argument"},
		{"hostname with a newline", "POST", "/v1/sandboxes", `{"hostname":"a\nb"}`, "invalid_argument"},
		{"hostname with a NUL", "POST", "/v1/sandboxes", `{"hostname":"a\u0000b"}`, "invalid_argument"},
		{"hostname with a space", "POST", "/v1/sandboxes", `{"hostname":"a b"}`, "invalid_argument"},
		{"hostname with slashes", "POST", "/v1/sandboxes", `{"hostname":"../../etc"}`, "invalid_argument"},
		{"hostname with a leading dash", "POST", "/v1/sandboxes", `{"hostname":"-a"}`, "invalid_argument"},
		{"hostname too long", "POST", "/v1/sandboxes", `{"hostname":"` + strings.Repeat("h", 65) + `"}`, "invalid_argument"},
		{"relative cwd", "POST", "/v1/sandboxes", `{"cwd":"relative"}`, "invalid_argument"},
		{"cwd with a NUL", "POST", "/v1/sandboxes", `{"cwd":"/a\u0000"}`, "invalid_argument"},
	})
	// None of those left a record behind.
	var l api.SandboxList
	c.mustJSON("GET", "/v1/sandboxes?limit=1000", nil, 200, &l)
	for _, sb := range l.Sandboxes {
		if sb.Id == "Bad" || sb.Id == "a b" || sb.State == api.Creating || sb.State == api.Failed {
			t.Errorf("a refused create left %+v", sb)
		}
	}
}

func TestBadExec(t *testing.T) {
	t.Parallel()
	c, id := badFixture(t)
	ex := func(fields string) string { return `{"cmd":"cat"` + fields + `}` }
	mib := 1 << 20
	cases := []bad{
		{"empty cmd", "POST", "/v1/sandboxes/{id}/exec", `{"cmd":""}`, "invalid_argument"},
		{"no cmd", "POST", "/v1/sandboxes/{id}/exec", `{}`, "invalid_argument"},
		{"cmd over 8 KiB", "POST", "/v1/sandboxes/{id}/exec", api.ExecRequest{Cmd: "true " + strings.Repeat("x", 8<<10)}, "payload_too_large"},
		{"cmd with a NUL", "POST", "/v1/sandboxes/{id}/exec", `{"cmd":"echo a\u0000b"}`, "invalid_argument"},
		{"env value with a NUL", "POST", "/v1/sandboxes/{id}/exec", ex(`,"env":{"A":"x\u0000y"}`), "invalid_argument"},
		{"env key with a NUL", "POST", "/v1/sandboxes/{id}/exec", ex(`,"env":{"A\u0000":"x"}`), "invalid_argument"},
		{"env key with =", "POST", "/v1/sandboxes/{id}/exec", ex(`,"env":{"A=B":"x"}`), "invalid_argument"},
		{"empty env key", "POST", "/v1/sandboxes/{id}/exec", ex(`,"env":{"":"x"}`), "invalid_argument"},
		{"cwd with a NUL", "POST", "/v1/sandboxes/{id}/exec", ex(`,"cwd":"/tmp\u0000"`), "invalid_argument"},
		{"missing cwd", "POST", "/v1/sandboxes/{id}/exec", ex(`,"cwd":"/does/not/exist"`), "not_found"},
		{"cwd is a file", "POST", "/v1/sandboxes/{id}/exec", ex(`,"cwd":"/workspace/keep.txt"`), "invalid_argument"},
		{"stdin over 1 MiB", "POST", "/v1/sandboxes/{id}/exec", api.ExecRequest{Cmd: "cat", Stdin: strings.Repeat("x", mib+1)}, "payload_too_large"},
		{"base64 stdin over 1 MiB", "POST", "/v1/sandboxes/{id}/exec", api.ExecRequest{Cmd: "cat",
			Stdin: base64.StdEncoding.EncodeToString(make([]byte, mib+1)), StdinEncoding: "base64"}, "payload_too_large"},
		{"bad base64 stdin", "POST", "/v1/sandboxes/{id}/exec", ex(`,"stdin":"!!!","stdin_encoding":"base64"`), "invalid_argument"},
		{"unpadded base64 stdin", "POST", "/v1/sandboxes/{id}/exec", ex(`,"stdin":"YQ","stdin_encoding":"base64"`), "invalid_argument"},
		{"unknown stdin encoding", "POST", "/v1/sandboxes/{id}/exec", ex(`,"stdin":"x","stdin_encoding":"hex"`), "invalid_argument"},
		{"unknown output encoding", "POST", "/v1/sandboxes/{id}/exec", ex(`,"encoding":"hex"`), "invalid_argument"},
		{"negative timeout", "POST", "/v1/sandboxes/{id}/exec", ex(`,"timeout":-1`), "invalid_argument"},
		{"timeout over an hour", "POST", "/v1/sandboxes/{id}/exec", ex(`,"timeout":3601`), "invalid_argument"},
		{"absurd timeout", "POST", "/v1/sandboxes/{id}/exec", ex(`,"timeout":1e300`), "invalid_argument"},
		{"overflowing timeout", "POST", "/v1/sandboxes/{id}/exec", ex(`,"timeout":1e400`), "invalid_argument"},
		{"timeout as a string", "POST", "/v1/sandboxes/{id}/exec", ex(`,"timeout":"5s"`), "invalid_argument"},
		{"negative max_output", "POST", "/v1/sandboxes/{id}/exec", ex(`,"max_output":-1`), "invalid_argument"},
		{"huge max_output", "POST", "/v1/sandboxes/{id}/exec", ex(`,"max_output":1099511627776`), "invalid_argument"},
		{"background buffered", "POST", "/v1/sandboxes/{id}/exec", ex(`,"background":true`), "invalid_argument"},
		{"unknown sandbox", "POST", "/v1/sandboxes/sbx-0000000000000000/exec", `{"cmd":"true"}`, "not_found"},
		{"sandbox id with odd characters", "POST", "/v1/sandboxes/A%20B%21/exec", `{"cmd":"true"}`, "not_found"},
		{"sandbox id with an escaped slash", "POST", "/v1/sandboxes/..%2F..%2Fetc/exec", `{"cmd":"true"}`, "not_found"},
		{"sandbox id with a NUL", "POST", "/v1/sandboxes/a%00b/exec", `{"cmd":"true"}`, "not_found"},
		{"very long sandbox id", "POST", "/v1/sandboxes/" + strings.Repeat("a", 4000) + "/exec", `{"cmd":"true"}`, "not_found"},
	}
	// The stream endpoint validates the same way before it starts.
	for _, bc := range cases[:len(cases)-5] {
		if bc.name == "background buffered" || bc.name == "unknown output encoding" || bc.name == "negative max_output" || bc.name == "huge max_output" {
			continue
		}
		bc.name += " (stream)"
		bc.path = "/v1/sandboxes/{id}/exec/stream"
		cases = append(cases, bc)
	}
	runBad(t, c, id, cases)
	// At the limits, not over them.
	if res := c.exec(id, api.ExecRequest{Cmd: "true " + strings.Repeat("x", 8<<10-5)}); res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("cmd of exactly 8 KiB: %+v", res)
	}
	res := c.exec(id, api.ExecRequest{Cmd: "wc -c", Stdin: strings.Repeat("y", mib)})
	if strings.TrimSpace(res.Stdout) != fmt.Sprint(mib) {
		t.Fatalf("stdin of exactly 1 MiB: %+v", res)
	}
	// The sandbox's processes hold nothing from the refused requests.
	var pl api.ProcessList
	c.mustJSON("GET", sbPath(id, "/processes"), nil, 200, &pl)
	for _, p := range pl.Processes {
		if p.Cmd != "echo ok" && p.Cmd != "wc -c" && !strings.HasPrefix(p.Cmd, "true x") {
			t.Errorf("a refused request ran %q", p.Cmd)
		}
	}
}

func TestBadProcessRequests(t *testing.T) {
	t.Parallel()
	c, id := badFixture(t)
	var bg, nostdin, tty api.Process
	c.mustJSON("POST", sbPath(id, "/processes"), api.StartProcessRequest{Cmd: "sleep 1000", Tag: "bg", Stdin: true}, 201, &bg)
	c.mustJSON("POST", sbPath(id, "/processes"), api.StartProcessRequest{Cmd: "sleep 1000", Tag: "nostdin"}, 201, &nostdin)
	c.mustJSON("POST", sbPath(id, "/terminals"), api.OpenTerminalRequest{Cmd: "sleep 1000", Tag: "tty"}, 201, &tty)
	p := "/v1/sandboxes/{id}/processes/"
	start := strings.TrimSuffix(p, "/")
	cases := []bad{
		{"start: empty cmd", "POST", start, `{"cmd":""}`, "invalid_argument"},
		{"start: cmd too long", "POST", start, api.StartProcessRequest{Cmd: strings.Repeat("x", 8<<10+1)}, "payload_too_large"},
		{"start: cmd with a NUL", "POST", start, `{"cmd":"a\u0000"}`, "invalid_argument"},
		{"start: env with =", "POST", start, `{"cmd":"true","env":{"A=B":"x"}}`, "invalid_argument"},
		{"start: negative timeout", "POST", start, `{"cmd":"true","timeout":-1}`, "invalid_argument"},
		{"start: absurd timeout", "POST", start, `{"cmd":"true","timeout":1e300}`, "invalid_argument"},
		{"start: negative rows", "POST", start, `{"cmd":"true","tty":true,"rows":-1,"cols":80}`, "invalid_argument"},
		{"start: too many cols", "POST", start, `{"cmd":"true","tty":true,"rows":24,"cols":70000}`, "invalid_argument"},
		{"start: unknown field", "POST", start, `{"cmd":"true","background":true}`, "invalid_argument"},
		{"start: missing cwd", "POST", start, `{"cmd":"true","cwd":"/nope"}`, "not_found"},
		{"get: unknown process", "GET", p + "999999", nil, "not_found"},
		{"get: unknown tag", "GET", p + "no-such-tag", nil, "not_found"},
		{"get: process id with a NUL", "GET", p + "a%00b", nil, "not_found"},
		{"output: negative from_seq", "GET", p + "bg/output?from_seq=-1", nil, "invalid_argument"},
		{"output: from_seq not a number", "GET", p + "bg/output?from_seq=x", nil, "invalid_argument"},
		{"output: follow not a bool", "GET", p + "bg/output?follow=maybe", nil, "invalid_argument"},
		{"output: unknown process", "GET", p + "999999/output", nil, "not_found"},
		{"stdin: close not a bool", "POST", p + "bg/stdin?close=2", "x", "invalid_argument"},
		{"stdin: unknown process", "POST", p + "999999/stdin", "x", "not_found"},
		{"stdin: no stdin", "POST", p + "nostdin/stdin", "x", "failed_precondition"},
		{"signal: unknown name", "POST", p + "bg/signal", `{"signal":"SIGFOO"}`, "invalid_argument"},
		{"signal: empty", "POST", p + "bg/signal", `{"signal":""}`, "invalid_argument"},
		{"signal: zero", "POST", p + "bg/signal", `{"signal":"0"}`, "invalid_argument"},
		{"signal: negative", "POST", p + "bg/signal", `{"signal":"-9"}`, "invalid_argument"},
		{"signal: too big", "POST", p + "bg/signal", `{"signal":"65"}`, "invalid_argument"},
		{"signal: huge", "POST", p + "bg/signal", `{"signal":"99999999999999999999"}`, "invalid_argument"},
		{"signal: just SIG", "POST", p + "bg/signal", `{"signal":"SIG"}`, "invalid_argument"},
		{"signal: number type", "POST", p + "bg/signal", `{"signal":9}`, "invalid_argument"},
		{"signal: unknown process", "POST", p + "999999/signal", `{"signal":"TERM"}`, "not_found"},
		{"wait: negative timeout", "POST", p + "bg/wait?timeout=-1", nil, "invalid_argument"},
		{"wait: timeout not a number", "POST", p + "bg/wait?timeout=soon", nil, "invalid_argument"},
		{"wait: absurd timeout", "POST", p + "bg/wait?timeout=1e300", nil, "invalid_argument"},
		{"wait: NaN timeout", "POST", p + "bg/wait?timeout=NaN", nil, "invalid_argument"},
		{"wait: Inf timeout", "POST", p + "bg/wait?timeout=Inf", nil, "invalid_argument"},
		{"wait: unknown process", "POST", p + "999999/wait?timeout=1", nil, "not_found"},
		{"terminal: too big", "POST", "/v1/sandboxes/{id}/terminals", `{"rows":2000,"cols":80}`, "invalid_argument"},
		{"terminal: cmd too long", "POST", "/v1/sandboxes/{id}/terminals", api.OpenTerminalRequest{Cmd: strings.Repeat("x", 8<<10+1)}, "payload_too_large"},
		{"resize: zero", "POST", "/v1/sandboxes/{id}/terminals/tty/resize", `{"rows":0,"cols":80}`, "invalid_argument"},
		{"resize: too big", "POST", "/v1/sandboxes/{id}/terminals/tty/resize", `{"rows":24,"cols":1001}`, "invalid_argument"},
		{"resize: missing cols", "POST", "/v1/sandboxes/{id}/terminals/tty/resize", `{"rows":24}`, "invalid_argument"},
		{"resize: unknown process", "POST", "/v1/sandboxes/{id}/terminals/999999/resize", `{"rows":24,"cols":80}`, "not_found"},
		{"terminal ws: negative scrollback", "GET", "/v1/sandboxes/{id}/terminals/tty/ws?scrollback=-1", nil, "invalid_argument"},
		{"terminal ws: not a terminal", "GET", "/v1/sandboxes/{id}/terminals/bg/ws", nil, "failed_precondition"},
		{"terminal ws: unknown process", "GET", "/v1/sandboxes/{id}/terminals/999999/ws", nil, "not_found"},
	}
	runBad(t, c, id, cases)
	// The processes survived every refused request.
	for _, tag := range []string{"bg", "nostdin", "tty"} {
		var pr api.Process
		c.mustJSON("GET", sbPath(id, "/processes/"+tag), nil, 200, &pr)
		if !pr.Running {
			t.Errorf("process %s stopped: %+v", tag, pr)
		}
	}
	// Named and numbered signals do work.
	for _, sig := range []string{"sigcont", "CONT", "SIGCONT", "18"} {
		c.mustJSON("POST", sbPath(id, "/processes/bg/signal"), api.SignalRequest{Signal: sig}, 204, nil)
	}
}

func TestBadFileRequests(t *testing.T) {
	t.Parallel()
	c, id := badFixture(t)
	c.sh(id, "mkdir -p dir/sub && echo f > dir/f && echo x > plainfile")
	f := "/v1/sandboxes/{id}/files"
	nul := "keep.txt%00.png"
	cases := []bad{
		{"read: no path", "GET", f, nil, "invalid_argument"},
		{"read: empty path", "GET", f + "?path=", nil, "invalid_argument"},
		{"read: NUL", "GET", f + "?path=" + nul, nil, "invalid_argument"},
		{"read: missing", "GET", f + "?path=nope", nil, "not_found"},
		{"read: a directory", "GET", f + "?path=dir", nil, "failed_precondition"},
		{"read: under a file", "GET", f + "?path=plainfile/x", nil, "failed_precondition"},
		{"write: NUL", "PUT", f + "?path=" + nul, "x", "invalid_argument"},
		{"write: bad mode digits", "PUT", f + "?path=m&mode=999", "x", "invalid_argument"},
		{"write: hex mode", "PUT", f + "?path=m&mode=0x1ff", "x", "invalid_argument"},
		{"write: negative mode", "PUT", f + "?path=m&mode=-1", "x", "invalid_argument"},
		{"write: symbolic mode", "PUT", f + "?path=m&mode=rwxr-xr-x", "x", "invalid_argument"},
		{"write: mode too big", "PUT", f + "?path=m&mode=77777", "x", "invalid_argument"},
		{"write: mode with a space", "PUT", f + "?path=m&mode=+644", "x", "invalid_argument"},
		{"write: over a directory", "PUT", f + "?path=dir", "x", "failed_precondition"},
		{"write: under a file", "PUT", f + "?path=plainfile/x", "x", "failed_precondition"},
		{"delete: NUL", "DELETE", f + "?path=" + nul, nil, "invalid_argument"},
		{"delete: missing", "DELETE", f + "?path=nope", nil, "not_found"},
		{"delete: directory without recursive", "DELETE", f + "?path=dir", nil, "failed_precondition"},
		{"delete: recursive not a bool", "DELETE", f + "?path=dir&recursive=yes", nil, "invalid_argument"},
		{"stat: NUL", "GET", f + "/stat?path=" + nul, nil, "invalid_argument"},
		{"stat: missing", "GET", f + "/stat?path=nope", nil, "not_found"},
		{"exists: NUL", "GET", f + "/exists?path=" + nul, nil, "invalid_argument"},
		{"exists: no path", "GET", f + "/exists", nil, "invalid_argument"},
		{"list: NUL", "GET", f + "/list?path=" + nul, nil, "invalid_argument"},
		{"list: depth 0", "GET", f + "/list?path=dir&depth=0", nil, "invalid_argument"},
		{"list: negative depth", "GET", f + "/list?path=dir&depth=-1", nil, "invalid_argument"},
		{"list: depth 65", "GET", f + "/list?path=dir&depth=65", nil, "invalid_argument"},
		{"list: depth not a number", "GET", f + "/list?path=dir&depth=deep", nil, "invalid_argument"},
		{"list: bad glob", "GET", f + "/list?path=dir&glob=%5B", nil, "invalid_argument"},
		{"list: missing", "GET", f + "/list?path=nope", nil, "not_found"},
		{"mkdir: NUL", "POST", f + "/mkdir", `{"path":"a\u0000b"}`, "invalid_argument"},
		{"mkdir: empty path", "POST", f + "/mkdir", `{"path":""}`, "invalid_argument"},
		{"mkdir: bad mode", "POST", f + "/mkdir", `{"path":"m","mode":"888"}`, "invalid_argument"},
		{"mkdir: mode as a number", "POST", f + "/mkdir", `{"path":"m","mode":755}`, "invalid_argument"},
		{"mkdir: over a file", "POST", f + "/mkdir", `{"path":"plainfile"}`, "failed_precondition"},
		{"rename: NUL", "POST", f + "/rename", `{"from":"keep.txt","to":"a\u0000b"}`, "invalid_argument"},
		{"rename: empty to", "POST", f + "/rename", `{"from":"keep.txt","to":""}`, "invalid_argument"},
		{"rename: missing from", "POST", f + "/rename", `{"from":"nope","to":"x"}`, "not_found"},
		{"archive get: NUL", "GET", f + "/archive?path=" + nul, nil, "invalid_argument"},
		{"archive get: missing", "GET", f + "/archive?path=nope", nil, "not_found"},
		{"archive put: NUL", "PUT", f + "/archive?path=" + nul, tarOf(t, map[string]string{"a": "a"}), "invalid_argument"},
		{"archive put: not a tar", "PUT", f + "/archive?path=untar", strings.Repeat("garbage!", 200), "invalid_argument"},
		{"archive put: entry leaves the dir", "PUT", f + "/archive?path=untar", tarOf(t, map[string]string{"../escaped.txt": "x"}), "invalid_argument"},
		{"archive put: entry deep outside", "PUT", f + "/archive?path=untar", tarOf(t, map[string]string{"a/../../../../escaped.txt": "x"}), "invalid_argument"},
		{"archive put: over a file", "PUT", f + "/archive?path=plainfile", tarOf(t, map[string]string{"a": "a"}), "failed_precondition"},
	}
	runBad(t, c, id, cases)
	if out := c.sh(id, "ls /workspace /escaped.txt 2>&1; cat dir/f plainfile"); strings.Contains(out, "escaped.txt\n") || !strings.HasSuffix(out, "f\nx\n") {
		t.Fatalf("files after the refused requests: %q", out)
	}
	// `..` past the root stays inside: the sandbox's own hostname.
	host := c.sh(id, "cat /etc/hostname")
	for _, p := range []string{"/../../etc/hostname", "../../../../../etc/hostname", "/workspace/../../../etc/hostname"} {
		r := c.do("GET", sbPath(id, "/files?path="+q(p)), nil)
		if r.Status != 200 || string(r.Body) != host {
			t.Errorf("read %s: %s, want the sandbox's %q", p, r, host)
		}
	}
	// A symlink pointing out of the sandbox resolves inside it.
	c.sh(id, "ln -s /../../../../etc/hostname up && ln -s ../../../../../.. root")
	for _, p := range []string{"up", "root/etc/hostname"} {
		r := c.do("GET", sbPath(id, "/files?path="+q(p)), nil)
		if r.Status != 200 || string(r.Body) != host {
			t.Errorf("read %s: %s, want the sandbox's %q", p, r, host)
		}
	}
	// The house table's good modes are accepted.
	var fi api.FileInfo
	c.mustJSON("PUT", sbPath(id, "/files?path=m&mode=0600"), "x", 200, &fi)
	if fi.Mode != "0600" {
		t.Fatalf("mode 0600 written as %s", fi.Mode)
	}
	c.mustJSON("PUT", sbPath(id, "/files?path=m2&mode=4755"), "x", 200, &fi)
	if fi.Mode != "04755" {
		t.Fatalf("mode 4755 written as %s", fi.Mode)
	}
}

func TestBadListAndKeyRequests(t *testing.T) {
	t.Parallel()
	c, id := badFixture(t)
	runBad(t, c, id, []bad{
		{"label without =", "GET", "/v1/sandboxes?label=novalue", nil, "invalid_argument"},
		{"label with empty key", "GET", "/v1/sandboxes?label=%3Dv", nil, "invalid_argument"},
		{"page token garbage", "GET", "/v1/sandboxes?page_token=%21%21%21", nil, "invalid_argument"},
		{"page token short", "GET", "/v1/sandboxes?page_token=AAAA", nil, "invalid_argument"},
		{"page token huge", "GET", "/v1/sandboxes?page_token=" + strings.Repeat("A", 5000), nil, "invalid_argument"},
		{"unknown state", "GET", "/v1/sandboxes?state=bogus", nil, "invalid_argument"},
		{"one unknown state", "GET", "/v1/sandboxes?state=running,bogus", nil, "invalid_argument"},
		{"limit 0", "GET", "/v1/sandboxes?limit=0", nil, "invalid_argument"},
		{"negative limit", "GET", "/v1/sandboxes?limit=-1", nil, "invalid_argument"},
		{"limit too big", "GET", "/v1/sandboxes?limit=1001", nil, "invalid_argument"},
		{"limit not a number", "GET", "/v1/sandboxes?limit=all", nil, "invalid_argument"},
		{"key without name", "POST", "/v1/keys", `{}`, "invalid_argument"},
		{"key with negative expiry", "POST", "/v1/keys", `{"name":"x","expires_in":-1}`, "invalid_argument"},
		{"key with a huge expiry", "POST", "/v1/keys", `{"name":"x","expires_in":9223372036854775807}`, "invalid_argument"},
		{"key with a long name", "POST", "/v1/keys", api.CreateKeyRequest{Name: strings.Repeat("n", 300)}, "invalid_argument"},
		{"revoke empty", "DELETE", "/v1/keys/%20", nil, "not_found"},
		{"no such route", "GET", "/v1/nope", nil, "not_found"},
		{"no such sandbox sub-route", "GET", "/v1/sandboxes/{id}/nope", nil, "not_found"},
	})
	// Filters that are fine still work.
	var l api.SandboxList
	c.mustJSON("GET", "/v1/sandboxes?state=running,failed&label=a%3Db&limit=1", nil, 200, &l)
}

// TestClientHangUp: a client that goes away mid-stream aborts a
// foreground command but not a background one, and the daemon serves on.
func TestClientHangUp(t *testing.T) {
	t.Parallel()
	c, id := badFixture(t)
	for _, background := range []bool{false, true} {
		tag := fmt.Sprintf("hangup-%v", background)
		ctx, cancel := context.WithCancel(context.Background())
		req := c.request(ctx, "POST", sbPath(id, "/exec/stream"),
			api.ExecRequest{Cmd: "echo started; sleep 1000", Tag: tag, Background: background})
		res, err := c.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		// Read up to the first output so the command surely runs.
		dec := json.NewDecoder(res.Body)
		for {
			var ev api.ExecEvent
			if err := dec.Decode(&ev); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if ev.Type == api.ExecEventTypeOutput {
				break
			}
		}
		cancel()
		res.Body.Close()
		var p api.Process
		waitFor(t, "the process table to settle", 5*time.Second, func() bool {
			c.mustJSON("GET", sbPath(id, "/processes/"+tag), nil, 200, &p)
			return p.Running == background
		})
		if background {
			time.Sleep(200 * time.Millisecond)
			c.mustJSON("GET", sbPath(id, "/processes/"+tag), nil, 200, &p)
			if !p.Running {
				t.Fatalf("a background stream's process died with its client: %+v", p)
			}
			c.mustJSON("POST", sbPath(id, "/processes/"+tag+"/signal"), api.SignalRequest{Signal: "KILL"}, 204, nil)
		} else if p.Exit == nil || !p.Exit.Killed || p.Exit.ExitCode != nil {
			t.Fatalf("a foreground stream's process after hang-up: %+v %+v", p, p.Exit)
		}
	}
	// A client that hangs up mid-upload leaves the old file whole.
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	req := c.request(ctx, "PUT", sbPath(id, "/files?path=keep.txt"), pr)
	req.ContentLength = 1 << 20
	done := make(chan error, 1)
	go func() {
		res, err := c.hc.Do(req)
		if err == nil {
			res.Body.Close()
		}
		done <- err
	}()
	_, _ = pw.Write(bytes.Repeat([]byte("z"), 64<<10))
	time.Sleep(100 * time.Millisecond)
	cancel()
	_ = pw.CloseWithError(io.ErrUnexpectedEOF)
	<-done
	// A buffered exec whose client leaves is killed too.
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		time.Sleep(300 * time.Millisecond)
		cancel()
	}()
	if res, err := c.hc.Do(c.request(ctx, "POST", sbPath(id, "/exec"), api.ExecRequest{Cmd: "sleep 1000", Tag: "hangup-buffered"})); err == nil {
		res.Body.Close()
		t.Fatalf("buffered exec answered %d before its client left", res.StatusCode)
	}
	waitFor(t, "the buffered exec to be killed", 5*time.Second, func() bool {
		var p api.Process
		c.mustJSON("GET", sbPath(id, "/processes/hangup-buffered"), nil, 200, &p)
		return !p.Running
	})
	healthy(t, c, id, "keep.txt", "precious")
}

// TestCreateHangUp: a create whose client leaves before the answer leaves
// nothing: no record, no sandbox directory (nobody could know its id).
// It runs on a daemon without a warm pool, where a create takes tens of
// milliseconds, so the clients surely leave while it is under way.
func TestCreateHangUp(t *testing.T) {
	t.Parallel()
	d := ownDaemon(t, func(cfg *daemon.Config) { cfg.WarmInits = -1 })
	c := local(t, d)
	newSandbox(t, c, api.CreateSandboxRequest{}) // makes the host base once
	dataDir := filepath.Dir(d.Socket)            // the socket is DataDir/hutch.sock
	for i := range 8 {
		id := fmt.Sprintf("hangup-%d", i)
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(2+i)*time.Millisecond)
		res, err := c.hc.Do(c.request(ctx, "POST", "/v1/sandboxes", api.CreateSandboxRequest{Id: id}))
		cancel()
		if err == nil {
			res.Body.Close()
			t.Logf("create %s answered %d within %v; not a hang-up", id, res.StatusCode, time.Duration(2+i)*time.Millisecond)
			continue
		}
		waitFor(t, id+" to be dropped", 5*time.Second, func() bool {
			r := c.do("GET", sbPath(id, ""), nil)
			_, statErr := os.Stat(filepath.Join(dataDir, "sandboxes", id))
			return r.Status == 404 && os.IsNotExist(statErr)
		})
	}
	after := newSandbox(t, c, api.CreateSandboxRequest{})
	if out := c.sh(after.Id, "echo fine"); out != "fine\n" {
		t.Fatalf("after the hang-ups: %q", out)
	}
}

// Network policies and ports: every malformed rule is refused with what is
// wrong, and refusing one changes nothing (the shared daemon has no
// networking, so any policy but deny-all is a failed precondition).
func TestBadNetworkAndPorts(t *testing.T) {
	t.Parallel()
	c, id := badFixture(t)
	net := "/v1/sandboxes/{id}/network"
	runBad(t, c, id, []bad{
		{"mode", "PUT", net, `{"mode":"open"}`, "invalid_argument"},
		{"rule with host and cidr", "PUT", net, `{"mode":"allow-list","allow":[{"host":"a.example","cidr":"1.2.3.4"}]}`, "invalid_argument"},
		{"empty rule", "PUT", net, `{"mode":"allow-list","allow":[{}]}`, "invalid_argument"},
		{"port 0", "PUT", net, `{"mode":"allow-list","allow":[{"host":"a.example","ports":[0]}]}`, "invalid_argument"},
		{"port 70000", "PUT", net, `{"mode":"allow-list","allow":[{"host":"a.example","ports":[70000]}]}`, "invalid_argument"},
		{"IP as host", "PUT", net, `{"mode":"allow-list","allow":[{"host":"1.2.3.4"}]}`, "invalid_argument"},
		{"bad cidr", "PUT", net, `{"mode":"allow-list","allow":[{"cidr":"1.2.3.0/40"}]}`, "invalid_argument"},
		{"wildcard in the middle", "PUT", net, `{"mode":"allow-list","allow":[{"host":"a.*.example"}]}`, "invalid_argument"},
		{"bad deny", "PUT", net, `{"mode":"allow-all","deny":["evil.example"]}`, "invalid_argument"},
		{"credential header injection", "PUT", net, `{"mode":"allow-all","credentials":[{"host":"a.example","headers":{"X":"a\r\nB: c"}}]}`, "invalid_argument"},
		{"credential without headers", "PUT", net, `{"mode":"allow-all","credentials":[{"host":"a.example","headers":{}}]}`, "invalid_argument"},
		{"no networking here", "PUT", net, `{"mode":"allow-all"}`, "failed_precondition"},
		{"create with a bad policy", "POST", "/v1/sandboxes", `{"network":{"mode":"allow-list","allow":[{"host":"-bad-.example"}]}}`, "invalid_argument"},
		{"port -1", "POST", "/v1/sandboxes/{id}/ports", `{"port":-1}`, "invalid_argument"},
		{"proxy to port 0", "GET", "/v1/sandboxes/{id}/ports/0/", nil, "not_found"},
		{"port too big", "POST", "/v1/sandboxes/{id}/ports", `{"port":65536}`, "invalid_argument"},
		{"port not a number", "POST", "/v1/sandboxes/{id}/ports", `{"port":"80"}`, "invalid_argument"},
		{"unexpose a non-number", "DELETE", "/v1/sandboxes/{id}/ports/http", nil, "invalid_argument"},
		{"proxy to a port not exposed", "GET", "/v1/sandboxes/{id}/ports/8080/", nil, "not_found"},
		{"proxy to a port of no sandbox", "GET", "/v1/sandboxes/nope/ports/8080/", nil, "not_found"},
	})
	var p api.NetworkPolicy
	c.mustJSON("GET", sbPath(id, "/network"), nil, 200, &p)
	if p.Mode != "deny-all" {
		t.Fatalf("after the refusals the policy is %+v", p)
	}
}
