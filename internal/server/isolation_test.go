package server_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/sandbox"
)

// scope says how tenant isolation applies to an endpoint.
type scope int

const (
	scoped         scope = iota // takes a sandbox id: another tenant's is 404, like a missing one
	keyAdmin                    // API keys: local socket only, 403 over TCP
	tenantWide                  // acts on the caller's own tenant (create, list)
	public                      // no key needed
	templateScoped              // takes a template name: another tenant's is 404, like a missing one
)

// isoCase is one endpoint of api/openapi.yaml, with a well-formed request
// for it. {id} and {process} are filled in; proc says which process of
// the sandbox {process} is ("bg" or "tty").
type isoCase struct {
	method, path string // exactly as in the spec, without /v1
	query        string
	body         any
	hdr          []string
	proc         string
	scope        scope
	// control is the status the owner gets for the same request on a
	// sandbox of its own: proof that the request is well-formed, so the
	// other tenant's 404 is isolation and not a bad request.
	control int
}

func tarOf(t testing.TB, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(files[n]))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// isoCases has a case for every operationId in the spec; a new endpoint
// without one fails TestIsolationCoversSpec.
func isoCases(t testing.TB) map[string]isoCase {
	tarball := tarOf(t, map[string]string{"a.txt": "from B"})
	return map[string]isoCase{
		"health":                 {method: "GET", path: "/health", scope: public, control: 200},
		"createSandbox":          {method: "POST", path: "/sandboxes", body: api.CreateSandboxRequest{}, scope: tenantWide, control: 201},
		"listSandboxes":          {method: "GET", path: "/sandboxes", scope: tenantWide, control: 200},
		"getSandbox":             {method: "GET", path: "/sandboxes/{id}", control: 200},
		"deleteSandbox":          {method: "DELETE", path: "/sandboxes/{id}", control: 204},
		"updateSandbox":          {method: "PATCH", path: "/sandboxes/{id}", body: map[string]any{"timeout": 3600}, control: 200},
		"pauseSandbox":           {method: "POST", path: "/sandboxes/{id}/pause", control: 200},
		"resumeSandbox":          {method: "POST", path: "/sandboxes/{id}/resume", control: 200},
		"suspendSandbox":         {method: "POST", path: "/sandboxes/{id}/suspend", control: 200},
		"downloadSandboxArchive": {method: "GET", path: "/sandboxes/{id}/archive", control: 200},
		"exec":                   {method: "POST", path: "/sandboxes/{id}/exec", body: api.ExecRequest{Cmd: "echo pwned > /workspace/pwned"}, control: 200},
		"execStream":             {method: "POST", path: "/sandboxes/{id}/exec/stream", body: api.ExecRequest{Cmd: "echo pwned > /workspace/pwned"}, control: 200},
		"execWebSocket":          {method: "GET", path: "/sandboxes/{id}/exec/ws", hdr: wsHeaders, control: 101},
		"startProcess":           {method: "POST", path: "/sandboxes/{id}/processes", body: api.StartProcessRequest{Cmd: "echo pwned > /workspace/pwned"}, control: 201},
		"listProcesses":          {method: "GET", path: "/sandboxes/{id}/processes", control: 200},
		"getProcess":             {method: "GET", path: "/sandboxes/{id}/processes/{process}", proc: "bg", control: 200},
		"processOutput":          {method: "GET", path: "/sandboxes/{id}/processes/{process}/output", proc: "bg", control: 200},
		"writeProcessStdin": {method: "POST", path: "/sandboxes/{id}/processes/{process}/stdin", proc: "bg",
			body: "pwned\n", control: 204},
		"signalProcess": {method: "POST", path: "/sandboxes/{id}/processes/{process}/signal", proc: "bg",
			body: api.SignalRequest{Signal: "KILL"}, control: 204},
		"waitProcess": {method: "POST", path: "/sandboxes/{id}/processes/{process}/wait", proc: "bg",
			query: "timeout=0.2", control: 504},
		"openTerminal":      {method: "POST", path: "/sandboxes/{id}/terminals", body: api.OpenTerminalRequest{}, control: 201},
		"terminalWebSocket": {method: "GET", path: "/sandboxes/{id}/terminals/{process}/ws", proc: "tty", hdr: wsHeaders, control: 101},
		"resizeTerminal": {method: "POST", path: "/sandboxes/{id}/terminals/{process}/resize", proc: "tty",
			body: api.ResizeRequest{Rows: 10, Cols: 10}, control: 204},
		"readFile":   {method: "GET", path: "/sandboxes/{id}/files", query: "path=secret.txt", control: 200},
		"writeFile":  {method: "PUT", path: "/sandboxes/{id}/files", query: "path=secret.txt", body: "overwritten", control: 200},
		"removeFile": {method: "DELETE", path: "/sandboxes/{id}/files", query: "path=gone.txt", control: 204},
		"statFile":   {method: "GET", path: "/sandboxes/{id}/files/stat", query: "path=secret.txt", control: 200},
		"fileExists": {method: "GET", path: "/sandboxes/{id}/files/exists", query: "path=secret.txt", control: 200},
		"listFiles":  {method: "GET", path: "/sandboxes/{id}/files/list", query: "path=/workspace", control: 200},
		"makeDir":    {method: "POST", path: "/sandboxes/{id}/files/mkdir", body: api.MkdirRequest{Path: "made"}, control: 200},
		"renameFile": {method: "POST", path: "/sandboxes/{id}/files/rename",
			body: api.RenameRequest{From: "rename-me.txt", To: "renamed.txt"}, control: 200},
		"downloadArchive": {method: "GET", path: "/sandboxes/{id}/files/archive", query: "path=/workspace", control: 200},
		"uploadArchive":   {method: "PUT", path: "/sandboxes/{id}/files/archive", query: "path=unpacked", body: tarball, control: 204},
		"getNetwork":      {method: "GET", path: "/sandboxes/{id}/network", control: 200},
		"setNetwork":      {method: "PUT", path: "/sandboxes/{id}/network", body: api.NetworkPolicy{Mode: "deny-all"}, control: 200},
		"networkEvents":   {method: "GET", path: "/sandboxes/{id}/network/events", control: 200},
		"exposePort":      {method: "POST", path: "/sandboxes/{id}/ports", body: api.ExposePortRequest{Port: 8080}, control: 200},
		"listPorts":       {method: "GET", path: "/sandboxes/{id}/ports", control: 200},
		"unexposePort":    {method: "DELETE", path: "/sandboxes/{id}/ports/{port}", control: 204},
		"snapshotSandbox": {method: "POST", path: "/sandboxes/{id}/snapshot", body: api.SnapshotRequest{Template: "iso-snap"}, control: 201},
		"forkSandbox":     {method: "POST", path: "/sandboxes/{id}/fork", body: api.ForkRequest{Count: 1}, control: 201},
		// Templates are per tenant: TestTemplateIsolation runs these.
		"listTemplates":   {method: "GET", path: "/templates", scope: tenantWide, control: 200},
		"putTemplate":     {method: "PUT", path: "/templates/{name}", body: api.TemplateDefinition{Setup: []string{"echo pwned > /pwned"}}, scope: tenantWide, control: 200},
		"getTemplate":     {method: "GET", path: "/templates/{name}", scope: templateScoped, control: 200},
		"buildTemplate":   {method: "POST", path: "/templates/{name}/build", scope: templateScoped, control: 200},
		"setTemplatePool": {method: "PUT", path: "/templates/{name}/pool", body: api.PoolRequest{Size: 0}, scope: templateScoped, control: 200},
		"deleteTemplate":  {method: "DELETE", path: "/templates/{name}", scope: templateScoped, control: 204},
		"createKey":       {method: "POST", path: "/keys", body: api.CreateKeyRequest{Name: "b's"}, scope: keyAdmin, control: 201},
		"listKeys":        {method: "GET", path: "/keys", scope: keyAdmin, control: 200},
		"revokeKey":       {method: "DELETE", path: "/keys/{key}", scope: keyAdmin, control: 200},
	}
}

// specOps reads operationId -> (method, path) from api.Spec.
func specOps(t testing.TB) map[string][2]string {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]yaml.Node `yaml:"paths"`
	}
	if err := yaml.Unmarshal(api.Spec, &doc); err != nil {
		t.Fatalf("parse api.Spec: %v", err)
	}
	ops := map[string][2]string{}
	for path, item := range doc.Paths {
		for method, node := range item {
			switch method {
			case "get", "put", "post", "delete", "patch", "head", "options", "trace":
			default:
				continue
			}
			var op struct {
				OperationID string `yaml:"operationId"`
			}
			if err := node.Decode(&op); err != nil || op.OperationID == "" {
				t.Fatalf("%s %s: no operationId (%v)", method, path, err)
			}
			ops[op.OperationID] = [2]string{strings.ToUpper(method), path}
		}
	}
	if len(ops) < 30 {
		t.Fatalf("found only %d operations in api.Spec", len(ops))
	}
	return ops
}

// TestIsolationCoversSpec: every operation of the contract has an
// isolation case, with the spec's method and path, and no case is stale.
func TestIsolationCoversSpec(t *testing.T) {
	t.Parallel()
	ops, cases := specOps(t), isoCases(t)
	for id, mp := range ops {
		c, ok := cases[id]
		if !ok {
			t.Errorf("operation %s (%s %s) has no tenant isolation case in isoCases", id, mp[0], mp[1])
			continue
		}
		if c.method != mp[0] || c.path != mp[1] {
			t.Errorf("operation %s: case says %s %s, spec says %s %s", id, c.method, c.path, mp[0], mp[1])
		}
		if strings.Contains(c.path, "{id}") != (c.scope == scoped) {
			t.Errorf("operation %s: a path with {id} must be sandbox-scoped and vice versa", id)
		}
	}
	for id := range cases {
		if _, ok := ops[id]; !ok {
			t.Errorf("isolation case %s is not an operation of the spec", id)
		}
	}
}

// isoTemplate is the template name the template cases act on.
const isoTemplate = "iso-tmpl"

// fill makes a case's request path for a sandbox and its processes.
func (c isoCase) fill(id string, procs map[string]string, key string) string {
	p := strings.NewReplacer("{id}", id, "{process}", procs[c.proc], "{key}", key, "{name}", isoTemplate, "{port}", "8080").Replace("/v1" + c.path)
	if c.query != "" {
		p += "?" + c.query
	}
	return p
}

func (c isoCase) send(cl *client, path string) resp {
	cl.t.Helper()
	return cl.do(c.method, path, c.body, c.hdr...)
}

// tenantFixture is a sandbox with a file, a background process reading
// stdin, a terminal, and files for the rename, remove and read cases.
type tenantFixture struct {
	id    string
	procs map[string]string
}

func newFixture(t *testing.T, c *client) tenantFixture {
	t.Helper()
	sb := newSandbox(t, c, api.CreateSandboxRequest{Labels: map[string]string{"owner": "a"}})
	c.sh(sb.Id, "printf 'A secret' > secret.txt && echo x > gone.txt && echo y > rename-me.txt")
	var bg, tty api.Process
	c.mustJSON("POST", sbPath(sb.Id, "/processes"), api.StartProcessRequest{Cmd: "cat > /dev/null; sleep 1000", Tag: "bg", Stdin: true}, 201, &bg)
	c.mustJSON("POST", sbPath(sb.Id, "/terminals"), api.OpenTerminalRequest{Tag: "tty"}, 201, &tty)
	return tenantFixture{id: sb.Id, procs: map[string]string{"bg": bg.Id, "tty": tty.Id}}
}

// TestTenantIsolation: tenant B, over TCP, calls every sandbox-scoped
// endpoint on tenant A's sandbox and gets the same 404 as for an id that
// does not exist; A's sandbox is untouched afterwards.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	d := shared(t)
	a, aKey := newTenant(t, d, "tenant-a")
	b, _ := newTenant(t, d, "tenant-b")
	target := newFixture(t, a)
	control := newFixture(t, a)
	missing := sandbox.NewID()
	cases := isoCases(t)
	var before api.ProcessList
	a.mustJSON("GET", sbPath(target.id, "/processes"), nil, 200, &before)

	names := make([]string, 0, len(cases))
	for n := range cases {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		c := cases[name]
		if c.scope != scoped {
			continue
		}
		onA := c.send(b, c.fill(target.id, target.procs, ""))
		ea := checkErr(t, name+" by B on A's sandbox", onA, "not_found")
		onMissing := c.send(b, c.fill(missing, target.procs, ""))
		em := checkErr(t, name+" by B on a missing sandbox", onMissing, "not_found")
		if ma, mm := strings.ReplaceAll(ea.Message, target.id, "ID"), strings.ReplaceAll(em.Message, missing, "ID"); ma != mm {
			t.Errorf("%s: B can tell A's sandbox from a missing one:\n  A's:     %q\n  missing: %q", name, ma, mm)
		}
		if !slices.Equal(bodyKeys(t, onA), bodyKeys(t, onMissing)) {
			t.Errorf("%s: error bodies differ in shape: %s vs %s", name, onA.Body, onMissing.Body)
		}
	}

	// A is untouched: state, files, processes.
	var sb api.Sandbox
	a.mustJSON("GET", sbPath(target.id, ""), nil, 200, &sb)
	if sb.State != api.Running {
		t.Fatalf("A's sandbox is %s after B's attempts", sb.State)
	}
	if out := a.sh(target.id, "cat secret.txt; ls /workspace | tr '\\n' ' '"); out != "A secretgone.txt rename-me.txt secret.txt " {
		t.Fatalf("A's workspace changed: %q", out)
	}
	var after api.ProcessList
	a.mustJSON("GET", sbPath(target.id, "/processes"), nil, 200, &after)
	running := 0
	for _, p := range after.Processes {
		if p.Running && (p.Id == target.procs["bg"] || p.Id == target.procs["tty"]) {
			running++
		}
	}
	// `a.sh` above adds one finished process; B added none.
	if running != 2 || len(after.Processes) != len(before.Processes)+1 {
		t.Fatalf("A's processes changed: before %+v, after %+v", before.Processes, after.Processes)
	}
	r := a.do("GET", sbPath(target.id, "/processes/bg/output"), nil)
	if r.Status != 200 || strings.Contains(string(r.Body), "pwned") {
		t.Fatalf("A's process output: %s", r)
	}

	// The same requests from A on a sandbox of its own succeed: they are
	// well-formed, so B's 404s above are isolation. Delete goes last.
	// Lifecycle calls go last, in the order that makes each succeed
	// (there is an archive to download only once suspended).
	order := []string{"signalProcess", "pauseSandbox", "resumeSandbox", "suspendSandbox", "downloadSandboxArchive", "deleteSandbox"}
	last := func(n string) int { return slices.Index(order, n) + 1 }
	slices.SortStableFunc(names, func(x, y string) int { return last(x) - last(y) })
	for _, name := range names {
		c := cases[name]
		if c.scope != scoped {
			continue
		}
		if r := c.send(a, c.fill(control.id, control.procs, "")); r.Status != c.control {
			t.Errorf("control %s by A on its own sandbox: got %s, want %d", name, r, c.control)
		}
	}

	// Keys: 403 over TCP, whatever the key; A's key still works after
	// B's revocation attempt.
	for _, name := range names {
		if c := cases[name]; c.scope == keyAdmin {
			checkErr(t, name+" over TCP", c.send(b, c.fill("", nil, aKey)), "permission_denied")
		}
	}
	a.mustJSON("GET", sbPath(target.id, ""), nil, 200, nil)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func bodyKeys(t testing.TB, r resp) []string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("body %q: %v", r.Body, err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestTenantListsAndCreate: each tenant lists only its own sandboxes; the
// trusted socket lists everyone's; a tenant's id is not another's to take.
func TestTenantListsAndCreate(t *testing.T) {
	t.Parallel()
	d := shared(t)
	a, _ := newTenant(t, d, "list-a")
	b, _ := newTenant(t, d, "list-b")
	sa := newSandbox(t, a, api.CreateSandboxRequest{Labels: map[string]string{"who": "a"}})
	sbB := newSandbox(t, b, api.CreateSandboxRequest{Labels: map[string]string{"who": "b"}})
	ids := func(c *client, query string) []string {
		var l api.SandboxList
		c.mustJSON("GET", "/v1/sandboxes"+query, nil, 200, &l)
		var out []string
		for _, s := range l.Sandboxes {
			out = append(out, s.Id)
		}
		return out
	}
	for _, query := range []string{"", "?state=running", "?label=who%3Da", "?limit=1000"} {
		if got := ids(b, query); slices.Contains(got, sa.Id) || (query != "?label=who%3Da" && !slices.Contains(got, sbB.Id)) {
			t.Errorf("B lists %v with %q; A's is %s, B's %s", got, query, sa.Id, sbB.Id)
		}
		if got := ids(a, query); slices.Contains(got, sbB.Id) {
			t.Errorf("A lists B's sandbox with %q: %v", query, got)
		}
	}
	all := ids(local(t, d), "?limit=1000")
	if !slices.Contains(all, sa.Id) || !slices.Contains(all, sbB.Id) {
		t.Errorf("the local socket lists %v, want both %s and %s", all, sa.Id, sbB.Id)
	}
	// Paging through B's list never reaches A's sandbox either.
	token := ""
	for range 100 {
		var l api.SandboxList
		b.mustJSON("GET", "/v1/sandboxes?limit=1&page_token="+q(token), nil, 200, &l)
		for _, s := range l.Sandboxes {
			if s.Id == sa.Id {
				t.Fatalf("B's pages show A's sandbox")
			}
		}
		if token = l.NextPageToken; token == "" {
			break
		}
	}
	// B cannot create over A's chosen id, and A's sandbox survives the try.
	named := newSandbox(t, a, api.CreateSandboxRequest{Id: "iso-named-" + sa.Id[4:12]})
	r := b.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Id: named.Id})
	if r.Status/100 == 2 {
		t.Fatalf("B created a sandbox with A's id: %s", r)
	}
	a.mustJSON("GET", sbPath(named.Id, ""), nil, 200, nil)
	if out := a.sh(named.Id, "echo alive"); out != "alive\n" {
		t.Fatalf("A's named sandbox after B's create: %q", out)
	}
	// A remote tenant may not name host paths as a base: dir:/etc would
	// show it the host's /etc (shadow included), dir:DATA/sandboxes/ID
	// another tenant's files.
	for _, base := range []string{"dir:/etc", "dir:/", "dir:" + filepath.Dir(d.Socket), "oci:/etc/passwd", "oci:/x#y", "bogus"} {
		checkErr(t, "remote create with base "+base, b.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Base: base}), "permission_denied")
	}
	hostBase := newSandbox(t, b, api.CreateSandboxRequest{Base: "host", Hostname: "UPPER.example.com"})
	if out := b.sh(hostBase.Id, "hostname"); out != "UPPER.example.com\n" {
		t.Fatalf("hostname %q", out)
	}
	// The local socket reaches both tenants' sandboxes.
	l := local(t, d)
	l.mustJSON("GET", sbPath(sa.Id, ""), nil, 200, nil)
	l.mustJSON("GET", sbPath(sbB.Id, ""), nil, 200, nil)
}

// TestAuthentication: over TCP every endpoint but health, the spec and
// metrics needs a live key; the unix socket needs none.
func TestAuthentication(t *testing.T) {
	t.Parallel()
	d := shared(t)
	l := local(t, d)
	good, _ := newTenant(t, d, "auth-good")
	sb := newSandbox(t, good, api.CreateSandboxRequest{})

	var revoked, expiring api.CreatedKey
	l.mustJSON("POST", "/v1/keys", api.CreateKeyRequest{Name: "auth-revoked"}, 201, &revoked)
	l.mustJSON("POST", "/v1/keys", api.CreateKeyRequest{Name: "auth-expired", ExpiresIn: 1}, 201, &expiring)
	remote(t, d, revoked.Secret).mustJSON("GET", "/v1/sandboxes", nil, 200, nil)
	l.mustJSON("DELETE", "/v1/keys/"+revoked.Key.Id, nil, 200, nil)
	expiredAt := time.Now().Add(1100 * time.Millisecond)

	clients := map[string]*client{
		"no key":        remote(t, d, ""),
		"unknown key":   remote(t, d, "hutch_0000000000000000000000000000000000000000"),
		"malformed key": remote(t, d, "not-a-key"),
		"revoked key":   remote(t, d, revoked.Secret),
		"expired key":   remote(t, d, expiring.Secret),
		"corrupted key": remote(t, d, revoked.Secret+"x"),
	}
	time.Sleep(time.Until(expiredAt))
	cases := isoCases(t)
	for name, c := range cases {
		path := c.fill(sb.Id, map[string]string{"bg": "1", "tty": "1"}, revoked.Key.Id)
		for who, cl := range clients {
			r := c.send(cl, path)
			if c.scope == public {
				if r.Status != 200 {
					t.Errorf("%s with %s: %s, want 200", name, who, r)
				}
				continue
			}
			checkErr(t, name+" with "+who, r, "unauthenticated")
		}
	}
	// Other ways to get the header wrong.
	for _, h := range []string{"Basic Zm9vOmJhcg==", "Bearer", "Bearer ", "Token " + revoked.Secret, "bearer"} {
		r := remote(t, d, "").do("GET", "/v1/sandboxes", nil, "Authorization", h)
		checkErr(t, "Authorization: "+h, r, "unauthenticated")
	}
	// The scheme is case-insensitive; the live key still works; public
	// endpoints need nothing.
	r := remote(t, d, "").do("GET", sbPath(sb.Id, ""), nil, "Authorization", "bearer "+good.key)
	if r.Status != 200 {
		t.Fatalf("lower-case scheme: %s", r)
	}
	for _, p := range []string{"/v1/health", "/v1/openapi.yaml", "/metrics"} {
		if r := remote(t, d, "").do("GET", p, nil); r.Status != 200 {
			t.Errorf("GET %s without a key: %s", p, r)
		}
	}
	// Keys over the socket work; revoking twice succeeds; unknown is 404.
	l.mustJSON("DELETE", "/v1/keys/"+revoked.Key.Id, nil, 200, nil)
	l.wantErr("DELETE", "/v1/keys/key_doesnotexist", nil, "not_found")
	var kl api.KeyList
	l.mustJSON("GET", "/v1/keys", nil, 200, &kl)
	for _, k := range kl.Keys {
		if k.Id == revoked.Key.Id && k.RevokedAt == nil {
			t.Errorf("revoked key listed without revoked_at: %+v", k)
		}
	}
	if bytes.Contains(mustGet(t, l, "/v1/keys"), []byte(revoked.Secret)) {
		t.Fatal("the key list shows a secret")
	}
}

func mustGet(t testing.TB, c *client, path string) []byte {
	t.Helper()
	return c.mustJSON("GET", path, nil, http.StatusOK, nil).Body
}
