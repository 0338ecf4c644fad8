package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/blob"
	"github.com/hutch-dev/hutch/internal/e2b"
	"github.com/hutch-dev/hutch/internal/e2b/envdpb/filesystem/filesystempbconnect"
	"github.com/hutch-dev/hutch/internal/e2b/envdpb/process/processpbconnect"
	"github.com/hutch-dev/hutch/internal/sandbox"
	"github.com/hutch-dev/hutch/internal/store"
)

func TestMain(m *testing.M) {
	if native.IsInit() {
		native.InitMain()
	}
	os.Exit(m.Run())
}

// rig is the E2B handler over a real store, native backend and manager,
// served in front of a stand-in for hutch's own API (which answers 418, so
// a test can tell what passed through).
type rig struct {
	t      *testing.T
	url    string
	key    string
	mgr    *sandbox.Manager
	st     *store.Store
	h      *e2b.Handler
	client *http.Client
}

func newRig(t *testing.T) *rig {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the native backend maps uid ranges and makes idmapped mounts")
	}
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(dir, "hutch.db"))
	if err != nil {
		t.Fatal(err)
	}
	be, err := native.New(native.Options{DataDir: dir, WarmInits: -1})
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := blob.NewDir(filepath.Join(dir, "archives"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	mgr, err := sandbox.New(ctx, st, be, sandbox.Options{Logger: log, Blobs: blobs, LayerDir: filepath.Join(dir, "layers")})
	if err != nil {
		t.Fatal(err)
	}
	h, err := e2b.New(e2b.Config{Store: st, Manager: mgr, Logger: log, Domain: "hutch.test", SecretFile: filepath.Join(dir, "e2b.secret")})
	if err != nil {
		t.Fatal(err)
	}
	_, secret, err := st.CreateKey(ctx, "e2b", "tenant-a", nil)
	if err != nil {
		t.Fatal(err)
	}
	own := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	srv := httptest.NewServer(h.Wrap(own))
	t.Cleanup(func() {
		srv.Close()
		h.Close()
		sbs, _, _ := mgr.List(ctx, "", sandbox.ListOptions{Limit: 1000})
		for _, sb := range sbs {
			_ = mgr.Delete(ctx, "", sb.ID)
		}
		mgr.Close()
		be.Close()
		st.Close()
	})
	return &rig{t: t, url: srv.URL, key: secret, mgr: mgr, st: st, h: h, client: srv.Client()}
}

// do sends a control request with the rig's key and decodes a JSON answer
// into out (when non-nil); it returns the status.
func (r *rig) do(method, path string, body any, out any) int {
	r.t.Helper()
	return r.doKey(r.key, method, path, body, out)
}

func (r *rig) doKey(key, method, path string, body any, out any) int {
	r.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, r.url+path, rd)
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			r.t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, raw, err)
		}
	}
	return resp.StatusCode
}

type created struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	EnvdAccessToken string            `json:"envdAccessToken"`
	EnvdVersion     string            `json:"envdVersion"`
	State           string            `json:"state"`
	Metadata        map[string]string `json:"metadata"`
	EndAt           string            `json:"endAt"`
}

func (r *rig) create(body map[string]any) created {
	r.t.Helper()
	var c created
	if st := r.do("POST", "/v2/sandboxes", body, &c); st != http.StatusCreated {
		r.t.Fatalf("create: status %d", st)
	}
	return c
}

// envd is a sandbox's envd as the SDK reaches it in sandbox-URL mode: the
// rig's URL, the sandbox id in a header, the access token in another.
type envd struct {
	proc processpbconnect.ProcessClient
	fs   filesystempbconnect.FilesystemClient
	http *http.Client
	url  string
}

type headerRT struct {
	base http.RoundTripper
	hdr  http.Header
}

func (h headerRT) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range h.hdr {
		req.Header[k] = v
	}
	return h.base.RoundTrip(req)
}

func (r *rig) envd(c created) envd {
	hdr := http.Header{}
	hdr.Set("E2b-Sandbox-Id", c.SandboxID)
	hdr.Set("E2b-Sandbox-Port", "49983")
	hdr.Set("X-Access-Token", c.EnvdAccessToken)
	hc := &http.Client{Transport: headerRT{base: r.client.Transport, hdr: hdr}}
	// The process client speaks JSON, as the SDK does; the filesystem
	// client binary protobuf, which envd accepts too.
	return envd{proc: processpbconnect.NewProcessClient(hc, r.url, connect.WithProtoJSON()),
		fs:   filesystempbconnect.NewFilesystemClient(hc, r.url),
		http: hc, url: r.url}
}

func jsonDecode(resp *http.Response, v any) error {
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}
