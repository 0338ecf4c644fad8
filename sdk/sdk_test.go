package hutch_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/daemon"
	"github.com/hutch-dev/hutch/internal/daemon/daemontest"
	hutch "github.com/hutch-dev/hutch/sdk"
)

func TestMain(m *testing.M) {
	if native.IsInit() {
		native.InitMain()
	}
	os.Exit(m.Run())
}

// env is the daemon the SDK tests share, with a client on its socket.
type env struct {
	d    *daemon.Daemon
	sock *hutch.Client
}

// TestSDK runs every test against one real daemon (native backend, unix
// socket and TCP), in parallel.
func TestSDK(t *testing.T) {
	d := daemontest.Start(t)
	sock, err := hutch.New("unix://"+d.Socket, "")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{d: d, sock: sock}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, *env)
	}{
		{"Health", testHealth}, {"Errors", testErrors}, {"Auth", testAuth}, {"Keys", testKeys},
		{"Tenants", testTenants}, {"Sandboxes", testSandboxes}, {"List", testList},
		{"Exec", testExec}, {"ExecBinary", testExecBinary}, {"ExecEnds", testExecEnds},
		{"ExecStream", testExecStream}, {"ExecStreamCancel", testExecStreamCancel},
		{"ExecInteractive", testExecInteractive}, {"ExecInteractiveSignal", testExecInteractiveSignal},
		{"Processes", testProcesses}, {"ProcessFollow", testProcessFollow}, {"ProcessSignal", testProcessSignal},
		{"Background", testBackground}, {"Terminal", testTerminal}, {"TerminalErrors", testTerminalErrors},
		{"Files", testFiles}, {"FileTree", testFileTree}, {"BigFile", testBigFile}, {"Archive", testArchive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.f(t, e)
		})
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// sandbox creates a sandbox with c that the test deletes at its end.
func sandbox(t *testing.T, c *hutch.Client, o hutch.CreateOptions) *hutch.Sandbox {
	t.Helper()
	sb, err := c.Create(ctxT(t), o)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), sb.ID) })
	return sb
}

// tcpClient makes a key for tenant over the socket and a TCP client with it.
func (e *env) tcpClient(t *testing.T, tenant string) *hutch.Client {
	t.Helper()
	k, err := e.sock.CreateKey(ctxT(t), "test-"+tenant, hutch.KeyOptions{Tenant: tenant})
	if err != nil {
		t.Fatalf("create key: %v", err)
	}
	c, err := hutch.New("http://"+e.d.TCPAddr, k.Secret)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// wantErr checks err's class and that it is a *hutch.Error with a code
// and request id.
func wantErr(t *testing.T, err, class error, code string) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Fatalf("error %v: want %v", err, class)
	}
	var he *hutch.Error
	if !errors.As(err, &he) {
		t.Fatalf("error %T %v is no *hutch.Error", err, err)
	}
	if he.Code != code || he.Message == "" {
		t.Fatalf("error %+v: want code %s and a message", he, code)
	}
	if he.Status != 0 && he.RequestID == "" {
		t.Fatalf("error %+v has no request id", he)
	}
}

func testHealth(t *testing.T, e *env) {
	h, err := e.sock.Health(ctxT(t))
	if err != nil || h.Status != "ok" || h.Backend != "native" || h.Version != "test" {
		t.Fatalf("health over the socket: %+v, %v", h, err)
	}
	tcp, _ := hutch.New("http://"+e.d.TCPAddr+"/", "")
	if h, err := tcp.Health(ctxT(t)); err != nil || h.Status != "ok" {
		t.Fatalf("health over TCP without a key: %+v, %v", h, err)
	}
}

func testErrors(t *testing.T, e *env) {
	ctx := ctxT(t)
	_, err := e.sock.Get(ctx, "no-such-sandbox")
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	var he *hutch.Error
	if errors.As(err, &he); he.Status != 404 {
		t.Fatalf("status %d, want 404", he.Status)
	}
	_, err = e.sock.Create(ctx, hutch.CreateOptions{ID: "Bad_ID!"})
	wantErr(t, err, hutch.ErrInvalidArgument, "invalid_argument")
	sb := sandbox(t, e.sock, hutch.CreateOptions{})
	_, err = e.sock.Create(ctx, hutch.CreateOptions{ID: sb.ID})
	if !errors.Is(err, hutch.ErrAlreadyExists) && !errors.Is(err, hutch.ErrConflict) {
		t.Fatalf("duplicate id: %v", err)
	}
	_, err = sb.Exec(ctx, "")
	wantErr(t, err, hutch.ErrInvalidArgument, "invalid_argument")
	if _, err := hutch.New("ftp://x", ""); !errors.Is(err, hutch.ErrInvalidArgument) {
		t.Fatalf("bad host: %v", err)
	}
}

func testAuth(t *testing.T, e *env) {
	ctx := ctxT(t)
	for _, key := range []string{"", "hutch_not-a-real-key"} {
		c, _ := hutch.New("http://"+e.d.TCPAddr, key)
		_, _, err := c.List(ctx, hutch.ListOptions{})
		wantErr(t, err, hutch.ErrUnauthenticated, "unauthenticated")
		_, err = c.Sandbox("x").ExecInteractive(ctx, "true")
		wantErr(t, err, hutch.ErrUnauthenticated, "unauthenticated")
	}
	c := e.tcpClient(t, "auth")
	if _, _, err := c.List(ctx, hutch.ListOptions{}); err != nil {
		t.Fatalf("list with a good key: %v", err)
	}
	_, err := c.CreateKey(ctx, "sneaky", hutch.KeyOptions{})
	wantErr(t, err, hutch.ErrPermissionDenied, "permission_denied")
	_, err = c.ListKeys(ctx)
	wantErr(t, err, hutch.ErrPermissionDenied, "permission_denied")
}

func TestUnreachable(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("HUTCH_HOST", "")
	t.Setenv("HUTCH_DATA", dir)
	c, err := hutch.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if want := "unix://" + filepath.Join(dir, "hutch.sock"); c.Host() != want {
		t.Fatalf("host %q, want %q", c.Host(), want)
	}
	_, err = c.Health(t.Context())
	if !errors.Is(err, hutch.ErrUnavailable) {
		t.Fatalf("no daemon: %v, want ErrUnavailable", err)
	}
	_, err = c.Sandbox("x").AttachTerminal(t.Context(), "1", -1)
	if !errors.Is(err, hutch.ErrUnavailable) {
		t.Fatalf("no daemon, websocket: %v, want ErrUnavailable", err)
	}
	t.Setenv("HUTCH_DATA", "")
	if c, _ := hutch.FromEnv(); c.Host() != "unix://./.hutch/hutch.sock" {
		t.Fatalf("default host %q", c.Host())
	}
	t.Setenv("HUTCH_HOST", "http://127.0.0.1:1")
	t.Setenv("HUTCH_API_KEY", "k")
	if c, _ := hutch.FromEnv(); c.Host() != "http://127.0.0.1:1" {
		t.Fatalf("host from HUTCH_HOST %q", c.Host())
	}
}

func testKeys(t *testing.T, e *env) {
	ctx := ctxT(t)
	k, err := e.sock.CreateKey(ctx, "ci", hutch.KeyOptions{Tenant: "team-keys", ExpiresIn: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if k.Secret == "" || k.Key.Tenant != "team-keys" || k.Key.ExpiresAt == nil || k.Key.Name != "ci" {
		t.Fatalf("created key %+v", k)
	}
	keys, err := e.sock.ListKeys(ctx)
	if err != nil || !slices.ContainsFunc(keys, func(x hutch.Key) bool { return x.ID == k.Key.ID }) {
		t.Fatalf("list keys: %v, %+v", err, keys)
	}
	c, _ := hutch.New("http://"+e.d.TCPAddr, k.Secret)
	if _, _, err := c.List(ctx, hutch.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	rk, err := e.sock.RevokeKey(ctx, k.Key.ID)
	if err != nil || rk.RevokedAt == nil {
		t.Fatalf("revoke: %+v, %v", rk, err)
	}
	_, _, err = c.List(ctx, hutch.ListOptions{})
	wantErr(t, err, hutch.ErrUnauthenticated, "unauthenticated")
	_, err = e.sock.RevokeKey(ctx, "no-such-key")
	wantErr(t, err, hutch.ErrNotFound, "not_found")
}

func testTenants(t *testing.T, e *env) {
	ctx := ctxT(t)
	a, b := e.tcpClient(t, "tenant-a"), e.tcpClient(t, "tenant-b")
	sb := sandbox(t, a, hutch.CreateOptions{Labels: map[string]string{"who": "a"}})
	if _, err := a.Get(ctx, sb.ID); err != nil {
		t.Fatalf("own sandbox: %v", err)
	}
	_, err := b.Get(ctx, sb.ID)
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	_, err = b.Sandbox(sb.ID).Exec(ctx, "true")
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	_, err = b.Sandbox(sb.ID).ReadFile(ctx, "/etc/hostname")
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	_, err = b.Sandbox(sb.ID).ExecInteractive(ctx, "true")
	wantErr(t, err, hutch.ErrNotFound, "not_found")
	wantErr(t, b.Delete(ctx, sb.ID), hutch.ErrNotFound, "not_found")
	for s, err := range b.All(ctx, hutch.ListOptions{}) {
		if err != nil || s.ID == sb.ID {
			t.Fatalf("tenant b lists %+v, %v", s, err)
		}
	}
	if _, err := e.sock.Get(ctx, sb.ID); err != nil {
		t.Fatalf("the socket sees every tenant: %v", err)
	}
	if res, err := a.Sandbox(sb.ID).Exec(ctx, "echo mine"); err != nil || string(res.Stdout) != "mine\n" {
		t.Fatalf("exec over TCP: %+v, %v", res, err)
	}
}

func testSandboxes(t *testing.T, e *env) {
	ctx := ctxT(t)
	o := hutch.CreateOptions{ID: "sdk-full", Env: map[string]string{"GREETING": "hi"}, Cwd: "/tmp",
		Hostname: "box", Limits: hutch.Limits{MemoryMiB: 256, Pids: 128, CPUMillis: 500},
		Labels: map[string]string{"app": "sdk"}, Metadata: map[string]string{"owner": "me"}, Timeout: 90 * time.Minute}
	sb := sandbox(t, e.sock, o)
	if sb.ID != "sdk-full" || sb.State != hutch.StateRunning || sb.Base != "host" || sb.Limits != o.Limits ||
		sb.Labels["app"] != "sdk" || sb.Metadata["owner"] != "me" || sb.TimeoutSeconds != 5400 || sb.Client() != e.sock {
		t.Fatalf("created %+v", sb)
	}
	res, err := sb.Exec(ctx, `echo "$GREETING $(pwd) $(hostname)"`)
	if err != nil || string(res.Stdout) != "hi /tmp box\n" {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	h := e.sock.Sandbox(sb.ID)
	if err := h.Refresh(ctx); err != nil || h.CreatedAt.IsZero() || h.Hostname != "box" {
		t.Fatalf("refresh: %+v, %v", h, err)
	}
	if err := h.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.sock.Delete(ctx, sb.ID); err != nil {
		t.Fatalf("deleting again: %v", err)
	}
	if got, err := e.sock.Get(ctx, sb.ID); err != nil || got.State != hutch.StateDestroyed {
		t.Fatalf("after delete: %+v, %v", got, err)
	}
	_, err = sb.Exec(ctx, "true")
	wantErr(t, err, hutch.ErrConflict, "conflict")
}

func testList(t *testing.T, e *env) {
	ctx := ctxT(t)
	var ids []string
	for range 3 {
		ids = append(ids, sandbox(t, e.sock, hutch.CreateOptions{Labels: map[string]string{"suite": "list"}}).ID)
	}
	o := hutch.ListOptions{Labels: map[string]string{"suite": "list"}, States: []hutch.State{hutch.StateRunning}, Limit: 2}
	page, next, err := e.sock.List(ctx, o)
	if err != nil || len(page) != 2 || next == "" {
		t.Fatalf("first page: %d, %q, %v", len(page), next, err)
	}
	var all []string
	for s, err := range e.sock.All(ctx, o) {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, s.ID)
	}
	if !slices.Equal(all, ids) {
		t.Fatalf("all %v, want %v", all, ids)
	}
	for range e.sock.All(ctx, o) {
		break // stopping early is fine
	}
	page, _, err = e.sock.List(ctx, hutch.ListOptions{Labels: map[string]string{"suite": "list"}, States: []hutch.State{hutch.StatePaused}})
	if err != nil || len(page) != 0 {
		t.Fatalf("paused: %v, %v", page, err)
	}
	_, _, err = e.sock.List(ctx, hutch.ListOptions{Limit: 5000})
	wantErr(t, err, hutch.ErrInvalidArgument, "invalid_argument")
}
