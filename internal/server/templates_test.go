package server_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/api"
)

// buildEvents runs a template build and returns its NDJSON events.
func buildEvents(t *testing.T, c *client, name string) []api.TemplateBuildEvent {
	t.Helper()
	r := c.do("POST", "/v1/templates/"+name+"/build", nil)
	if r.Status != 200 || r.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("build %s: %s (%s)", name, r, r.Header.Get("Content-Type"))
	}
	var evs []api.TemplateBuildEvent
	sc := bufio.NewScanner(bytes.NewReader(r.Body))
	for sc.Scan() {
		var ev api.TemplateBuildEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("build event %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	if len(evs) == 0 {
		t.Fatalf("build %s: no events", name)
	}
	return evs
}

func buildOutput(evs []api.TemplateBuildEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		b.Write(ev.Data)
	}
	return b.String()
}

// TestTemplatesAPI: a template with setup, seeded files (text and
// base64) is built with a streamed log, then sandboxes from it see its
// files and name its generation; a failing setup reports its log.
func TestTemplatesAPI(t *testing.T) {
	t.Parallel()
	d := shared(t)
	c := local(t, d)
	def := api.TemplateDefinition{
		Setup: []string{"mkdir -p /opt/tool && echo built-ok && echo v1 > /opt/tool/version", "echo second >&2"},
		Files: []api.TemplateFile{{Path: "hello.txt", Content: "hello\n"},
			{Path: "/opt/bin.dat", Content: base64.StdEncoding.EncodeToString([]byte{0, 1, 2}), Encoding: "base64", Mode: "0600"}},
		Env: map[string]string{"TOOL": "on"},
	}
	var tp api.Template
	c.mustJSON("PUT", "/v1/templates/api-tmpl", def, 200, &tp)
	t.Cleanup(func() { c.do("DELETE", "/v1/templates/api-tmpl", nil) })
	if tp.Status != "none" || tp.Generation != "" || tp.Kind != api.Recipe || len(tp.Files) != 2 || tp.Files[1].Mode != "0600" || tp.Files[1].Size != 3 {
		t.Fatalf("put: %+v", tp)
	}
	evs := buildEvents(t, c, "api-tmpl")
	last := evs[len(evs)-1]
	if last.Type != api.TemplateBuildEventTypeDone || last.Generation == "" || last.Cached || last.Template == nil || last.Template.Status != "ready" {
		t.Fatalf("build ended with %+v", last)
	}
	if out := buildOutput(evs); !strings.Contains(out, "built-ok") || !strings.Contains(out, "second") {
		t.Fatalf("build output %q", out)
	}
	var steps []string
	for _, ev := range evs {
		if ev.Type == api.TemplateBuildEventTypeStep {
			steps = append(steps, ev.Cmd)
		}
	}
	if len(steps) != 3 {
		t.Fatalf("steps %q", steps)
	}
	if again := buildEvents(t, c, "api-tmpl"); len(again) != 1 || !again[0].Cached || again[0].Generation != last.Generation {
		t.Fatalf("second build: %+v", again)
	}
	sb := newSandbox(t, c, api.CreateSandboxRequest{Template: "api-tmpl", Env: map[string]string{"MORE": "yes"}})
	if sb.Template != "api-tmpl" || sb.Generation != last.Generation || sb.Env["TOOL"] != "on" || sb.Env["MORE"] != "yes" {
		t.Fatalf("sandbox from the template: %+v", sb)
	}
	if out := c.sh(sb.Id, "cat hello.txt /opt/tool/version; od -An -tx1 /opt/bin.dat; stat -c %a /opt/bin.dat; echo $TOOL $MORE"); out != "hello\nv1\n 00 01 02\n600\non yes\n" {
		t.Fatalf("in the sandbox: %q", out)
	}
	// A base of its own is refused; the template's own name is fine.
	c.wantErr("POST", "/v1/sandboxes", api.CreateSandboxRequest{Template: "api-tmpl", Base: "dir:/"}, "invalid_argument")

	// A failing setup: the build stream ends with an error carrying the
	// log; a create says the same with a 412.
	c.mustJSON("PUT", "/v1/templates/api-broken", api.TemplateDefinition{Setup: []string{"echo before-fail; exit 7"}}, 200, nil)
	t.Cleanup(func() { c.do("DELETE", "/v1/templates/api-broken", nil) })
	evs = buildEvents(t, c, "api-broken")
	last = evs[len(evs)-1]
	if last.Type != api.TemplateBuildEventTypeError || last.Error == nil || last.Error.Code != "failed_precondition" ||
		!strings.Contains(last.Error.Message, "before-fail") || last.Error.RequestId == "" {
		t.Fatalf("failed build ended with %+v", last)
	}
	e := c.wantErr("POST", "/v1/sandboxes", api.CreateSandboxRequest{Template: "api-broken"}, "failed_precondition")
	if !strings.Contains(e.Message, "before-fail") || !strings.Contains(e.Message, "status 7") {
		t.Fatalf("create from a broken template: %q", e.Message)
	}
	c.mustJSON("GET", "/v1/templates/api-broken", nil, 200, &tp)
	if tp.Status != "failed" || tp.LastBuild == nil || !strings.Contains(tp.LastBuild.Log, "before-fail") {
		t.Fatalf("broken template: %+v", tp)
	}
	var list api.TemplateList
	c.mustJSON("GET", "/v1/templates", nil, 200, &list)
	var names []string
	for _, x := range list.Templates {
		names = append(names, x.Name)
	}
	if !slices.Contains(names, "api-tmpl") || !slices.Contains(names, "api-broken") {
		t.Fatalf("list: %v", names)
	}
}

// TestSnapshotForkPoolAPI: snapshot and fork over the API, and a pool
// configured through it.
func TestSnapshotForkPoolAPI(t *testing.T) {
	t.Parallel()
	d := shared(t)
	c, _ := newTenant(t, d, "snapfork")
	src := newSandbox(t, c, api.CreateSandboxRequest{})
	c.sh(src.Id, "echo from-source > /workspace/f; sleep 300 >/dev/null 2>&1 &")
	var forks api.SandboxList
	c.mustJSON("POST", sbPath(src.Id, "/fork"), api.ForkRequest{Count: 2, Labels: map[string]string{"f": "1"}}, 201, &forks)
	if len(forks.Sandboxes) != 2 {
		t.Fatalf("forks: %+v", forks)
	}
	for _, f := range forks.Sandboxes {
		t.Cleanup(func() { c.do("DELETE", sbPath(f.Id, ""), nil) })
		if f.ForkedFrom != src.Id || f.Labels["f"] != "1" || f.State != api.Running {
			t.Fatalf("fork: %+v", f)
		}
		if out := c.sh(f.Id, "cat /workspace/f; pgrep sleep || echo none"); out != "from-source\nnone\n" {
			t.Fatalf("fork sees %q", out)
		}
	}
	var tp api.Template
	c.mustJSON("POST", sbPath(src.Id, "/snapshot"), api.SnapshotRequest{Template: "snapped"}, 201, &tp)
	if tp.Kind != api.Snapshot || tp.SnapshotOf != src.Id || tp.Generation == "" || tp.Status != "ready" {
		t.Fatalf("snapshot: %+v", tp)
	}
	c.mustJSON("PUT", "/v1/templates/snapped/pool", api.PoolRequest{Size: 1}, 200, &tp)
	t.Cleanup(func() { c.do("PUT", "/v1/templates/snapped/pool", api.PoolRequest{Size: 0}) })
	waitFor(t, "a ready pooled sandbox", 10*time.Second, func() bool {
		c.mustJSON("GET", "/v1/templates/snapped", nil, 200, &tp)
		return tp.Pool.Ready == 1
	})
	// The pooled sandbox belongs to no tenant: not listed for the tenant.
	var l api.SandboxList
	c.mustJSON("GET", "/v1/sandboxes?limit=1000&state=running", nil, 200, &l)
	before := len(l.Sandboxes)
	start := time.Now()
	sb := newSandbox(t, c, api.CreateSandboxRequest{Template: "snapped", Labels: map[string]string{"claimed": "yes"}})
	took := time.Since(start)
	if out := c.sh(sb.Id, "cat /workspace/f"); out != "from-source\n" || sb.Labels["claimed"] != "yes" || sb.Labels["hutch.pool"] != "" {
		t.Fatalf("claimed: %q %+v", out, sb)
	}
	c.mustJSON("GET", "/v1/sandboxes?limit=1000&state=running", nil, 200, &l)
	if len(l.Sandboxes) != before+1 {
		t.Fatalf("tenant lists %d running sandboxes, %d before the claim", len(l.Sandboxes), before)
	}
	t.Logf("create from a pool over TCP: %v", took)
	waitFor(t, "the pool to refill", 10*time.Second, func() bool {
		c.mustJSON("GET", "/v1/templates/snapped", nil, 200, &tp)
		return tp.Pool.Ready == 1
	})
	c.mustJSON("PUT", "/v1/templates/snapped/pool", api.PoolRequest{Size: 0}, 200, &tp)
	if tp.Pool.Ready != 0 {
		t.Fatalf("pool of 0 has %d ready", tp.Pool.Ready)
	}
}

// TestTemplateBadInput: malformed template requests are 4xx, never 500.
func TestTemplateBadInput(t *testing.T) {
	t.Parallel()
	d := shared(t)
	c := local(t, d)
	remoteC, _ := newTenant(t, d, "tmpl-bad")
	sb := newSandbox(t, c, api.CreateSandboxRequest{})
	c.mustJSON("PUT", "/v1/templates/bad-ok", api.TemplateDefinition{}, 200, nil)
	t.Cleanup(func() { c.do("DELETE", "/v1/templates/bad-ok", nil) })
	for _, bc := range []struct {
		name, method, path string
		body               any
		code               string
		cl                 *client
	}{
		{"bad name", "PUT", "/v1/templates/Bad%20Name", api.TemplateDefinition{}, "invalid_argument", c},
		{"unknown field", "PUT", "/v1/templates/x", `{"bogus":1}`, "invalid_argument", c},
		{"not an object", "PUT", "/v1/templates/x", `[]`, "invalid_argument", c},
		{"bad base64", "PUT", "/v1/templates/x", api.TemplateDefinition{Files: []api.TemplateFile{{Path: "a", Content: "!!", Encoding: "base64"}}}, "invalid_argument", c},
		{"bad encoding", "PUT", "/v1/templates/x", `{"files":[{"path":"a","encoding":"rot13"}]}`, "invalid_argument", c},
		{"bad mode", "PUT", "/v1/templates/x", api.TemplateDefinition{Files: []api.TemplateFile{{Path: "a", Mode: "999"}}}, "invalid_argument", c},
		{"file in /proc", "PUT", "/v1/templates/x", api.TemplateDefinition{Files: []api.TemplateFile{{Path: "/proc/x"}}}, "invalid_argument", c},
		{"empty setup", "PUT", "/v1/templates/x", api.TemplateDefinition{Setup: []string{" "}}, "invalid_argument", c},
		{"relative cwd", "PUT", "/v1/templates/x", api.TemplateDefinition{Cwd: "rel"}, "invalid_argument", c},
		{"bad env", "PUT", "/v1/templates/x", api.TemplateDefinition{Env: map[string]string{"A=B": "c"}}, "invalid_argument", c},
		{"missing mount source", "PUT", "/v1/templates/x", api.TemplateDefinition{Mounts: []api.TemplateMount{{Path: "/m", Source: "/no/such/dir"}}}, "invalid_argument", c},
		{"remote mount", "PUT", "/v1/templates/x", api.TemplateDefinition{Mounts: []api.TemplateMount{{Path: "/m", Source: "/etc"}}}, "permission_denied", remoteC},
		{"remote dir base", "PUT", "/v1/templates/x", api.TemplateDefinition{Base: "dir:/"}, "permission_denied", remoteC},
		{"missing template", "GET", "/v1/templates/nope", nil, "not_found", c},
		{"build missing", "POST", "/v1/templates/nope/build", nil, "not_found", c},
		{"delete missing", "DELETE", "/v1/templates/nope", nil, "not_found", c},
		{"pool missing", "PUT", "/v1/templates/nope/pool", api.PoolRequest{Size: 1}, "not_found", c},
		{"pool no size", "PUT", "/v1/templates/bad-ok/pool", `{}`, "invalid_argument", c},
		{"pool negative", "PUT", "/v1/templates/bad-ok/pool", api.PoolRequest{Size: -1}, "invalid_argument", c},
		{"pool huge", "PUT", "/v1/templates/bad-ok/pool", api.PoolRequest{Size: 1 << 30}, "invalid_argument", c},
		{"pool string", "PUT", "/v1/templates/bad-ok/pool", `{"size":"1"}`, "invalid_argument", c},
		{"fork too many", "POST", sbPath(sb.Id, "/fork"), api.ForkRequest{Count: 17}, "invalid_argument", c},
		{"fork negative", "POST", sbPath(sb.Id, "/fork"), api.ForkRequest{Count: -1}, "invalid_argument", c},
		{"fork missing", "POST", sbPath("sbx-nope", "/fork"), api.ForkRequest{}, "not_found", c},
		{"snapshot bad name", "POST", sbPath(sb.Id, "/snapshot"), api.SnapshotRequest{Template: "Bad"}, "invalid_argument", c},
		{"snapshot no name", "POST", sbPath(sb.Id, "/snapshot"), `{}`, "invalid_argument", c},
		{"snapshot over a recipe", "POST", sbPath(sb.Id, "/snapshot"), api.SnapshotRequest{Template: "bad-ok"}, "conflict", c},
		{"snapshot missing", "POST", sbPath("sbx-nope", "/snapshot"), api.SnapshotRequest{Template: "y"}, "not_found", c},
	} {
		checkErr(t, bc.name, bc.cl.do(bc.method, bc.path, bc.body), bc.code)
	}
	c.wantErr("GET", "/v1/templates/x", nil, "not_found") // none of the bad puts stored anything
}

// TestTemplateIsolation: tenant B gets the same 404 for A's template as
// for a missing one on every template endpoint; B's put makes B's own
// template and leaves A's alone; lists are per tenant and the local
// socket sees every tenant's.
func TestTemplateIsolation(t *testing.T) {
	t.Parallel()
	d := shared(t)
	a, _ := newTenant(t, d, "tmpl-a")
	b, _ := newTenant(t, d, "tmpl-b")
	l := local(t, d)
	def := api.TemplateDefinition{Files: []api.TemplateFile{{Path: "secret.txt", Content: "A's secret"}}}
	a.mustJSON("PUT", "/v1/templates/"+isoTemplate, def, 200, nil)
	var aT api.Template
	a.mustJSON("GET", "/v1/templates/"+isoTemplate, nil, 200, &aT)
	buildEvents(t, a, isoTemplate)
	cases := isoCases(t)
	names := make([]string, 0, len(cases))
	for n, c := range cases {
		if c.scope == templateScoped {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if len(names) < 4 {
		t.Fatalf("only %d template-scoped cases", len(names))
	}
	for _, name := range names {
		c := cases[name]
		onA := c.send(b, c.fill("", nil, ""))
		ea := checkErr(t, name+" by B on A's template", onA, "not_found")
		missing := strings.Replace(c.fill("", nil, ""), isoTemplate, "iso-missing", 1)
		em := checkErr(t, name+" by B on a missing template", b.do(c.method, missing, c.body), "not_found")
		if ma, mm := strings.ReplaceAll(ea.Message, isoTemplate, "NAME"), strings.ReplaceAll(em.Message, "iso-missing", "NAME"); ma != mm {
			t.Errorf("%s: B can tell A's template from a missing one: %q vs %q", name, ma, mm)
		}
	}
	// B cannot create from A's template either.
	checkErr(t, "create from A's template by B", b.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Template: isoTemplate}), "not_found")
	// B's put makes B's own template; A's is untouched.
	put := cases["putTemplate"]
	if r := put.send(b, put.fill("", nil, "")); r.Status != put.control {
		t.Fatalf("B's put: %s", r)
	}
	var after api.Template
	a.mustJSON("GET", "/v1/templates/"+isoTemplate, nil, 200, &after)
	if after.Status != "ready" || len(after.Setup) != 0 || len(after.Files) != 1 || after.Files[0].Sha256 != aT.Files[0].Sha256 {
		t.Fatalf("A's template after B's put: %+v", after)
	}
	sb := newSandbox(t, a, api.CreateSandboxRequest{Template: isoTemplate})
	if out := a.sh(sb.Id, "cat secret.txt; test -e /pwned && echo pwned || true"); out != "A's secret" {
		t.Fatalf("A's sandbox from its template: %q", out)
	}
	listNames := func(c *client) []string {
		var tl api.TemplateList
		c.mustJSON("GET", "/v1/templates", nil, 200, &tl)
		var out []string
		for _, x := range tl.Templates {
			out = append(out, x.Tenant+"/"+x.Name)
		}
		return out
	}
	if got := listNames(a); !slices.Equal(got, []string{"/" + isoTemplate}) {
		t.Errorf("A lists %v", got) // the tenant field is shown on the local socket only
	}
	if got := listNames(b); !slices.Equal(got, []string{"/" + isoTemplate}) {
		t.Errorf("B lists %v", got)
	}
	all := listNames(l)
	var iso []string
	for _, n := range all {
		if strings.HasSuffix(n, "/"+isoTemplate) {
			iso = append(iso, n)
		}
	}
	if len(iso) != 2 {
		t.Errorf("the local socket lists %v, want both tenants' %s", all, isoTemplate)
	}
	// The control: A's requests on its own template succeed (delete last).
	slices.SortStableFunc(names, func(x, y string) int { return boolInt(x == "deleteTemplate") - boolInt(y == "deleteTemplate") })
	for _, name := range names {
		c := cases[name]
		if r := c.send(a, c.fill("", nil, "")); r.Status != c.control {
			t.Errorf("control %s by A: got %s, want %d", name, r, c.control)
		}
	}
	b.do("DELETE", "/v1/templates/"+isoTemplate, nil)
}
