package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/daemon"
	"github.com/hutch-dev/hutch/internal/sandbox"
)

// The tests share one real daemon (native backend, SQLite store, unix
// socket and TCP) started lazily by shared(): starting one costs a warm
// pool of inits, and the tests run in parallel, each on sandboxes of its
// own. Tests that need a daemon of their own (restart) start one.
func TestMain(m *testing.M) {
	if native.IsInit() {
		native.InitMain()
	}
	before := runtime.NumGoroutine()
	code := m.Run()
	stopShared()
	if code == 0 {
		code = leakCheck(before)
	}
	os.Exit(code)
}

// leakCheck waits for the goroutines the tests started to end, and prints
// those that do not. (goleak is not among the module's requirements.)
func leakCheck(before int) int {
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		fmt.Fprintf(os.Stderr, "%d goroutines left over (%d before the tests):\n%s\n", n, before, buf[:runtime.Stack(buf, true)])
		return 1
	}
	return 0
}

var (
	sharedOnce sync.Once
	sharedD    *daemon.Daemon
	sharedDir  string
	sharedErr  error
	sharedLog  = &logBuffer{}
)

// logBuffer keeps the shared daemon's warnings so a failing test can show
// them; the daemon outlives every single test.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a real daemon needs root (the native backend maps uid ranges and makes idmapped mounts)")
	}
}

// traversableTempDir makes a directory an unprivileged uid can walk into
// (a sandbox's root is one).
func traversableTempDir(pattern string) (string, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	for d := dir; d != "/" && d != filepath.Clean(os.TempDir()); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			return "", err
		}
	}
	return dir, nil
}

func startDaemon(dir, socket string, logw io.Writer, mutate ...func(*daemon.Config)) (*daemon.Daemon, error) {
	cfg := daemon.Config{DataDir: dir, Socket: socket, Listen: "127.0.0.1:0", Version: "test", Grace: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	for _, f := range mutate {
		f(&cfg)
	}
	return daemon.Start(context.Background(), cfg)
}

// ownDaemon starts a daemon of the test's own, stopped (with its
// sandboxes destroyed) when the test ends.
func ownDaemon(t testing.TB, mutate ...func(*daemon.Config)) *daemon.Daemon {
	t.Helper()
	requireRoot(t)
	dir, err := traversableTempDir("hutch-own-test-")
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	d, err := startDaemon(dir, "", logs, mutate...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", logs.String())
		}
		ctx := context.Background()
		sbs, _, _ := d.Manager.List(ctx, "", sandboxListAll)
		for _, sb := range sbs {
			_ = d.Manager.Delete(ctx, "", sb.ID)
		}
		_ = d.Stop()
		_ = os.RemoveAll(dir)
	})
	return d
}

// shared returns the package's daemon, starting it on first use.
func shared(t testing.TB) *daemon.Daemon {
	t.Helper()
	requireRoot(t)
	sharedOnce.Do(func() {
		if sharedDir, sharedErr = traversableTempDir("hutch-server-test-"); sharedErr != nil {
			return
		}
		sharedD, sharedErr = startDaemon(sharedDir, "", sharedLog)
	})
	if sharedErr != nil {
		t.Fatalf("start the shared daemon: %v", sharedErr)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("shared daemon log so far:\n%s", sharedLog.String())
		}
	})
	return sharedD
}

var sandboxListAll = sandbox.ListOptions{Limit: 1000}

func stopShared() {
	if sharedD == nil {
		return
	}
	ctx := context.Background()
	sbs, _, _ := sharedD.Manager.List(ctx, "", sandboxListAll)
	for _, sb := range sbs {
		_ = sharedD.Manager.Delete(ctx, "", sb.ID)
	}
	_ = sharedD.Stop()
	_ = os.RemoveAll(sharedDir)
}

// client talks HTTP to one daemon listener, as one tenant (or trusted).
type client struct {
	t    testing.TB
	base string // http://unix or http://127.0.0.1:port
	key  string // bearer secret; "" sends none
	hc   *http.Client
}

func unixHTTPClient(socket string) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: 16,
	}
	return &http.Client{Transport: tr}
}

// local is a trusted client on d's unix socket.
func local(t testing.TB, d *daemon.Daemon) *client {
	hc := unixHTTPClient(d.Socket)
	t.Cleanup(hc.CloseIdleConnections)
	return &client{t: t, base: "http://hutch", hc: hc}
}

// remote is a client on d's TCP listener with key (which may be "").
func remote(t testing.TB, d *daemon.Daemon, key string) *client {
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	t.Cleanup(tr.CloseIdleConnections)
	return &client{t: t, base: "http://" + d.TCPAddr, key: key, hc: &http.Client{Transport: tr}}
}

// newTenant creates an API key over the trusted socket and returns a TCP
// client that uses it, with the key's id.
func newTenant(t testing.TB, d *daemon.Daemon, name string) (*client, string) {
	t.Helper()
	var ck api.CreatedKey
	local(t, d).mustJSON("POST", "/v1/keys", api.CreateKeyRequest{Name: name}, http.StatusCreated, &ck)
	return remote(t, d, ck.Secret), ck.Key.Id
}

// resp is a finished response.
type resp struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r resp) String() string { return fmt.Sprintf("%d %s", r.Status, bytes.TrimSpace(r.Body)) }

// apiErr decodes an error body.
func (r resp) apiErr(t testing.TB) api.Error {
	t.Helper()
	var e api.Error
	if err := json.Unmarshal(r.Body, &e); err != nil {
		t.Fatalf("error body %q: %v", r.Body, err)
	}
	return e
}

// request builds a request; body may be nil, []byte, string, io.Reader or
// a value sent as JSON.
func (c *client) request(ctx context.Context, method, path string, body any) *http.Request {
	c.t.Helper()
	var rd io.Reader
	ctype := ""
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	case io.Reader:
		rd = b
	default:
		js, err := json.Marshal(b)
		if err != nil {
			c.t.Fatal(err)
		}
		rd, ctype = bytes.NewReader(js), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	return req
}

// do sends a request and reads the whole answer.
func (c *client) do(method, path string, body any, hdr ...string) resp {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := c.request(ctx, method, path, body)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	if res.StatusCode == http.StatusSwitchingProtocols {
		return resp{Status: res.StatusCode, Header: res.Header} // a WebSocket: hang up
	}
	b, err := io.ReadAll(res.Body)
	if err != nil {
		c.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp{Status: res.StatusCode, Header: res.Header, Body: b}
}

// wsHeaders make a plain HTTP request a WebSocket handshake.
var wsHeaders = []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13",
	"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}

// mustJSON sends a request, wants status, and decodes the body into out
// (when out is not nil).
func (c *client) mustJSON(method, path string, body any, status int, out any) resp {
	c.t.Helper()
	r := c.do(method, path, body)
	if r.Status != status {
		c.t.Fatalf("%s %s: got %s, want %d", method, path, r, status)
	}
	if out != nil {
		if err := json.Unmarshal(r.Body, out); err != nil {
			c.t.Fatalf("%s %s: decode %q: %v", method, path, r.Body, err)
		}
	}
	return r
}

// wantErr sends a request and wants the standard error body with code
// and the status the house table gives it.
func (c *client) wantErr(method, path string, body any, code string) api.Error {
	c.t.Helper()
	r := c.do(method, path, body)
	return checkErr(c.t, method+" "+path, r, code)
}

var statusOfCode = map[string]int{
	"invalid_argument": 400, "unauthenticated": 401, "permission_denied": 403, "not_found": 404,
	"already_exists": 409, "conflict": 409, "failed_precondition": 412, "payload_too_large": 413,
	"resource_exhausted": 429, "not_implemented": 501, "unavailable": 503, "deadline_exceeded": 504,
	"internal": 500,
}

func checkErr(t testing.TB, what string, r resp, code string) api.Error {
	t.Helper()
	if r.Status != statusOfCode[code] {
		t.Fatalf("%s: got %s, want %d %s", what, r, statusOfCode[code], code)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: error Content-Type %q", what, ct)
	}
	e := r.apiErr(t)
	if e.Code != code || e.Message == "" || e.RequestId == "" {
		t.Fatalf("%s: error body %+v, want code %s, a message and a request id", what, e, code)
	}
	if got := r.Header.Get("X-Request-Id"); got != e.RequestId {
		t.Fatalf("%s: X-Request-Id %q, body request_id %q", what, got, e.RequestId)
	}
	return e
}

// newSandbox creates a sandbox through c and deletes it when the test ends.
func newSandbox(t testing.TB, c *client, req api.CreateSandboxRequest) api.Sandbox {
	t.Helper()
	var sb api.Sandbox
	c.mustJSON("POST", "/v1/sandboxes", req, http.StatusCreated, &sb)
	if sb.State != api.Running {
		t.Fatalf("new sandbox %s is %s, want running", sb.Id, sb.State)
	}
	t.Cleanup(func() {
		r := c.do("DELETE", "/v1/sandboxes/"+sb.Id, nil)
		if r.Status != http.StatusNoContent {
			t.Errorf("delete %s: %s", sb.Id, r)
		}
	})
	return sb
}

// exec runs cmd with a buffered exec and returns the result.
func (c *client) exec(id string, req api.ExecRequest) api.ExecResult {
	c.t.Helper()
	var res api.ExecResult
	c.mustJSON("POST", "/v1/sandboxes/"+id+"/exec", req, http.StatusOK, &res)
	return res
}

// sh runs cmd and wants exit 0; it returns stdout.
func (c *client) sh(id, cmd string) string {
	c.t.Helper()
	res := c.exec(id, api.ExecRequest{Cmd: cmd})
	if res.ExitCode == nil || *res.ExitCode != 0 {
		c.t.Fatalf("%q: %+v", cmd, res)
	}
	return res.Stdout
}

func q(v string) string { return url.QueryEscape(v) }

// sbPath is /v1/sandboxes/ID + rest.
func sbPath(id, rest string) string { return "/v1/sandboxes/" + id + rest }

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// healthy checks that a sandbox still runs commands and still has the
// file it was given.
func healthy(t testing.TB, c *client, id, path, content string) {
	t.Helper()
	r := c.do("GET", sbPath(id, "/files?path="+q(path)), nil)
	if r.Status != http.StatusOK || string(r.Body) != content {
		t.Fatalf("file %s of %s: %s, want %q", path, id, r, content)
	}
	if out := c.sh(id, "echo ok"); out != "ok\n" {
		t.Fatalf("exec in %s after the batch: %q", id, out)
	}
}
