package server_test

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/api"
)

func TestFiles(t *testing.T) {
	t.Parallel()
	d := shared(t)
	c := local(t, d)
	id := newSandbox(t, c, api.CreateSandboxRequest{}).Id
	f := func(rest string) string { return sbPath(id, "/files"+rest) }

	// Write creates parents, atomically replaces, keeps binary exact.
	data := bytes.Repeat([]byte{0, 1, 2, 0xff, '\n'}, 100000)
	var fi api.FileInfo
	c.mustJSON("PUT", f("?path=a/b/c.bin&mode=0640"), data, 200, &fi)
	if fi.Path != "/workspace/a/b/c.bin" || fi.Name != "c.bin" || fi.Size != int64(len(data)) || fi.Mode != "0640" || fi.Type != api.File || fi.IsDir {
		t.Fatalf("written %+v", fi)
	}
	r := c.do("GET", f("?path=/workspace/a/b/c.bin"), nil)
	if r.Status != 200 || !bytes.Equal(r.Body, data) || r.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("read back %d bytes, %s", len(r.Body), r.Header.Get("Content-Type"))
	}
	c.mustJSON("PUT", f("?path=a/b/c.bin"), "short", 200, &fi)
	if r := c.do("GET", f("?path=a/b/c.bin"), nil); string(r.Body) != "short" {
		t.Fatalf("overwrite: %s", r)
	}
	c.mustJSON("PUT", f("?path=empty"), nil, 200, &fi)
	if fi.Size != 0 {
		t.Fatalf("empty file %+v", fi)
	}
	// The sandbox sees what the API wrote, and the reverse.
	// (A write without a mode sets 0644, also over an existing file.)
	if out := c.sh(id, "cat a/b/c.bin; stat -c %a a/b/c.bin; echo from-sh > /tmp/sh.txt"); out != "short644\n" {
		t.Fatalf("sandbox view %q", out)
	}
	if r := c.do("GET", f("?path=/tmp/sh.txt"), nil); string(r.Body) != "from-sh\n" {
		t.Fatalf("read what the sandbox wrote: %s", r)
	}

	// Stat does not follow a final symlink; exists tells.
	c.sh(id, "ln -s a/b/c.bin link")
	c.mustJSON("GET", f("/stat?path=link"), nil, 200, &fi)
	if fi.Type != api.Symlink || fi.LinkTarget != "a/b/c.bin" {
		t.Fatalf("stat link %+v", fi)
	}
	c.mustJSON("GET", f("/stat?path=a"), nil, 200, &fi)
	if !fi.IsDir || fi.Type != api.Dir {
		t.Fatalf("stat dir %+v", fi)
	}
	var ex api.Exists
	for p, want := range map[string]bool{"a/b/c.bin": true, "link": true, "a": true, "nope": false, "a/nope/x": false} {
		c.mustJSON("GET", f("/exists?path="+q(p)), nil, 200, &ex)
		if ex.Exists != want {
			t.Errorf("exists %s: %v", p, ex.Exists)
		}
	}

	// Mkdir -p, with a mode; again is fine.
	c.mustJSON("POST", f("/mkdir"), api.MkdirRequest{Path: "d/e/f", Mode: "0700"}, 200, &fi)
	if !fi.IsDir || fi.Mode != "0700" || fi.Path != "/workspace/d/e/f" {
		t.Fatalf("mkdir %+v", fi)
	}
	c.mustJSON("POST", f("/mkdir"), api.MkdirRequest{Path: "d/e/f"}, 200, nil)

	// List: depth and glob.
	c.sh(id, "touch d/x.go d/y.txt d/e/z.go")
	names := func(query string) []string {
		var fl api.FileList
		c.mustJSON("GET", f("/list?"+query), nil, 200, &fl)
		var out []string
		for _, e := range fl.Files {
			out = append(out, strings.TrimPrefix(e.Path, "/workspace/"))
		}
		sort.Strings(out)
		return out
	}
	if got := names("path=d"); !slices.Equal(got, []string{"d/e", "d/x.go", "d/y.txt"}) {
		t.Errorf("list d: %v", got)
	}
	if got := names("path=d&depth=3"); !slices.Equal(got, []string{"d/e", "d/e/f", "d/e/z.go", "d/x.go", "d/y.txt"}) {
		t.Errorf("list d depth 3: %v", got)
	}
	if got := names("path=d&depth=2&glob=*.go"); !slices.Equal(got, []string{"d/e/z.go", "d/x.go"}) {
		t.Errorf("list d glob *.go: %v", got)
	}

	// Rename, and the old name is gone. (Unlike a write, a rename makes
	// no parent directories: into a missing one is not_found.)
	c.wantErr("POST", f("/rename"), api.RenameRequest{From: "d/y.txt", To: "/workspace/moved/y.txt"}, "not_found")
	c.mustJSON("POST", f("/mkdir"), api.MkdirRequest{Path: "moved"}, 200, nil)
	c.mustJSON("POST", f("/rename"), api.RenameRequest{From: "d/y.txt", To: "/workspace/moved/y.txt"}, 200, &fi)
	if fi.Path != "/workspace/moved/y.txt" || fi.Name != "y.txt" {
		t.Fatalf("renamed %+v", fi)
	}
	c.mustJSON("GET", f("/exists?path=d/y.txt"), nil, 200, &ex)
	if ex.Exists {
		t.Fatal("rename left the source")
	}

	// Remove: a file; a directory needs recursive; force ignores missing.
	c.mustJSON("DELETE", f("?path=empty"), nil, 204, nil)
	c.wantErr("DELETE", f("?path=d"), nil, "failed_precondition")
	c.mustJSON("DELETE", f("?path=d&recursive=true"), nil, 204, nil)
	c.mustJSON("DELETE", f("?path=d&force=true"), nil, 204, nil)
	c.wantErr("DELETE", f("?path=d"), nil, "not_found")
	if out := c.sh(id, "ls"); out != "a\nlink\nmoved\n" {
		t.Fatalf("after removes: %q", out)
	}
}

func TestArchiveRoundTrip(t *testing.T) {
	t.Parallel()
	d := shared(t)
	c := local(t, d)
	id := newSandbox(t, c, api.CreateSandboxRequest{}).Id
	c.sh(id, "mkdir -p src/sub/deeper && printf top > src/top.txt && printf deep > src/sub/deeper/d.txt && "+
		"head -c 300000 /dev/urandom > src/sub/rand.bin && chmod 750 src/sub && ln -s top.txt src/link && mkdir src/emptydir")
	r := c.do("GET", sbPath(id, "/files/archive?path=src"), nil)
	if r.Status != 200 || r.Header.Get("Content-Type") != "application/x-tar" {
		t.Fatalf("download: %d %s", r.Status, r.Header.Get("Content-Type"))
	}
	// The tar holds relative names only.
	tr := tar.NewReader(bytes.NewReader(r.Body))
	var entries []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("tar: %v", err)
		}
		if strings.HasPrefix(h.Name, "/") || strings.Contains(h.Name, "..") {
			t.Fatalf("tar entry %q", h.Name)
		}
		entries = append(entries, strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/"))
	}
	for _, want := range []string{"top.txt", "sub/deeper/d.txt", "sub/rand.bin", "link", "emptydir"} {
		if !slices.Contains(entries, want) {
			t.Errorf("tar lacks %s: %v", want, entries)
		}
	}
	// Upload it elsewhere (a directory that does not exist yet); the tree
	// comes out the same.
	c.mustJSON("PUT", sbPath(id, "/files/archive?path=/tmp/copy"), r.Body, http.StatusNoContent, nil)
	sum := "cd DIR && find . | sort && find . -type f -exec md5sum {} + | sort && stat -c '%n %a' sub && readlink link"
	orig := c.sh(id, strings.ReplaceAll(sum, "DIR", "/workspace/src"))
	cp := c.sh(id, strings.ReplaceAll(sum, "DIR", "/tmp/copy"))
	if orig != cp || !regexp.MustCompile(`sub 750`).MatchString(cp) {
		t.Fatalf("round trip differs:\n%s\nvs\n%s", orig, cp)
	}
	// An upload into an existing directory adds to it.
	c.mustJSON("PUT", sbPath(id, "/files/archive?path=/tmp/copy"), tarOf(t, map[string]string{"new.txt": "new"}), 204, nil)
	if out := c.sh(id, "cat /tmp/copy/new.txt /tmp/copy/top.txt"); out != "newtop" {
		t.Fatalf("added %q", out)
	}
}

// TestSpecAndMetrics: the served spec is the embedded one; the metrics
// carry the series the docs promise; request ids match.
func TestSpecAndMetrics(t *testing.T) {
	t.Parallel()
	d := shared(t)
	c := local(t, d)
	r := c.do("GET", "/v1/openapi.yaml", nil)
	if r.Status != 200 || !bytes.Equal(r.Body, api.Spec) {
		t.Fatalf("served spec: %d, %d bytes (embedded %d)", r.Status, len(r.Body), len(api.Spec))
	}
	var h api.Health
	c.mustJSON("GET", "/v1/health", nil, 200, &h)
	if h.Status != "ok" || h.Backend != "native" || h.Version != "test" {
		t.Fatalf("health %+v", h)
	}
	id := newSandbox(t, c, api.CreateSandboxRequest{}).Id
	c.sh(id, "true")
	e := c.wantErr("GET", sbPath("sbx-does-not-exist", ""), nil, "not_found")
	if r := c.do("GET", "/v1/health", nil); r.Header.Get("X-Request-Id") == "" || r.Header.Get("X-Request-Id") == e.RequestId {
		t.Fatalf("success X-Request-Id %q (error's %q)", r.Header.Get("X-Request-Id"), e.RequestId)
	}
	m := string(mustGet(t, c, "/metrics"))
	for _, re := range []string{
		`(?m)^hutch_sandboxes\{state="running"\} [1-9]`,
		`(?m)^hutch_exec_total\{kind="buffered"\} [1-9]`,
		`(?m)^hutch_exec_duration_seconds_bucket\{kind="buffered",le="0.1"\} [1-9]`,
		`(?m)^hutch_exec_duration_seconds_count\{kind="buffered"\} [1-9]`,
		`(?m)^hutch_errors_total\{code="not_found"\} [1-9]`,
		`(?m)^go_goroutines `,
	} {
		if !regexp.MustCompile(re).MatchString(m) {
			t.Errorf("metrics lack %s", re)
		}
	}
	// Over TCP the spec and metrics need no key.
	if r := remote(t, d, "").do("GET", "/v1/openapi.yaml", nil); !bytes.Equal(r.Body, api.Spec) {
		t.Fatalf("spec over TCP: %d", r.Status)
	}
}

// TestSandboxLifecycle: what a create asks for is what the sandbox is;
// delete is idempotent; a timeout destroys.
func TestSandboxLifecycle(t *testing.T) {
	t.Parallel()
	d := shared(t)
	c := local(t, d)
	req := api.CreateSandboxRequest{Env: map[string]string{"E": "1"}, Cwd: "/tmp", Hostname: "box-one",
		Labels: map[string]string{"team": "x"}, Metadata: map[string]string{"note": "hi"},
		Limits: api.Limits{MemoryMb: 256, Pids: 100, CpuMillis: 500}, Timeout: 600}
	sb := newSandbox(t, c, req)
	if sb.Env["E"] != "1" || sb.Cwd != "/tmp" || sb.Hostname != "box-one" || sb.Labels["team"] != "x" ||
		sb.Metadata["note"] != "hi" || sb.Limits != req.Limits || sb.Timeout != 600 || sb.Base != "host" ||
		sb.CreatedAt.IsZero() || sb.UpdatedAt.Before(sb.CreatedAt) {
		t.Fatalf("created %+v", sb)
	}
	if out := c.sh(sb.Id, "echo $E; pwd; hostname"); out != "1\n/tmp\nbox-one\n" {
		t.Fatalf("inside: %q", out)
	}
	var got api.Sandbox
	c.mustJSON("GET", sbPath(sb.Id, ""), nil, 200, &got)
	if got.Id != sb.Id || got.State != api.Running || got.Labels["team"] != "x" {
		t.Fatalf("get %+v", got)
	}
	// Delete twice: both succeed; the record stays, destroyed.
	short := newSandboxNoCleanup(t, c, api.CreateSandboxRequest{})
	c.mustJSON("DELETE", sbPath(short, ""), nil, 204, nil)
	c.mustJSON("DELETE", sbPath(short, ""), nil, 204, nil)
	c.mustJSON("GET", sbPath(short, ""), nil, 200, &got)
	if got.State != api.Destroyed || got.Reason == "" {
		t.Fatalf("deleted %+v", got)
	}
	c.wantErr("POST", sbPath(short, "/exec"), api.ExecRequest{Cmd: "true"}, "conflict")
	c.wantErr("GET", sbPath(short, "/files?path=x"), nil, "conflict")
	// A sandbox with a timeout goes by itself.
	timed := newSandboxNoCleanup(t, c, api.CreateSandboxRequest{Timeout: 1})
	waitFor(t, "the timed sandbox to be destroyed", 10*time.Second, func() bool {
		c.mustJSON("GET", sbPath(timed, ""), nil, 200, &got)
		return got.State == api.Destroyed
	})
	if got.Reason != "timeout" {
		t.Fatalf("timed out sandbox %+v", got)
	}
}
