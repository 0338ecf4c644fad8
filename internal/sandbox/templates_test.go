package sandbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/sandbox"
)

// countingHandler counts log records by message.
type countingHandler struct {
	slog.Handler
	mu sync.Mutex
	n  map[string]int
}

func (h *countingHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	h.n[r.Message]++
	h.mu.Unlock()
	return nil
}

func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }
func (h *countingHandler) Enabled(context.Context, slog.Level) bool {
	return true
}

func (h *countingHandler) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[msg]
}

// tenv is a manager with templates over a real store and backend in dir.
type tenv struct {
	*env
	logs *countingHandler
}

func openT(t *testing.T, dir string) *tenv {
	t.Helper()
	logs := &countingHandler{Handler: slog.NewTextHandler(io.Discard, nil), n: map[string]int{}}
	e := openWith(t, dir, func(o *sandbox.Options) {
		o.LayerDir = filepath.Join(dir, "layers")
		o.PoolInterval = 100 * time.Millisecond
		o.Logger = slog.New(logs)
	})
	return &tenv{env: e, logs: logs}
}

func (e *tenv) put(t *testing.T, name string, def sandbox.TemplateDef) sandbox.Template {
	t.Helper()
	return e.putFor(t, "", name, def)
}

func (e *tenv) putFor(t *testing.T, tenant, name string, def sandbox.TemplateDef) sandbox.Template {
	t.Helper()
	tp, err := e.m.PutTemplate(context.Background(), tenant, name, def)
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

// layerDirs lists the layer directories on disk.
func (e *tenv) layerDirs(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(e.dir, "layers"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, en := range entries {
		out = append(out, en.Name())
	}
	return out
}

const toolSetup = `mkdir -p /opt/tool/bin && printf '#!/bin/sh\necho tool "$@"\n' > /opt/tool/bin/tool && chmod 755 /opt/tool/bin/tool && echo installed`

func TestTemplateBuildAndCreate(t *testing.T) {
	t.Parallel()
	e := openT(t, newDir(t))
	ctx := context.Background()
	e.put(t, "py", sandbox.TemplateDef{Setup: []string{toolSetup, "echo $GREETING > /opt/greeting"},
		Env:   map[string]string{"GREETING": "hi", "PATH": "/opt/tool/bin:/usr/local/bin:/usr/bin:/bin"},
		Files: []sandbox.TemplateFile{{Path: "notes/readme.txt", Content: []byte("seeded\n")}, {Path: "~/.agents/skills/x/SKILL.md", Content: []byte("skill")}}})
	var steps []string
	var out strings.Builder
	tp, cached, err := e.m.BuildTemplate(ctx, "", "py", func(ev sandbox.BuildEvent) {
		if ev.Type == "step" {
			steps = append(steps, ev.Cmd)
		}
		out.Write(ev.Data)
	})
	if err != nil || cached || tp.Status != sandbox.TemplateReady || tp.Generation == "" {
		t.Fatalf("build: %+v cached=%v %v", tp, cached, err)
	}
	if len(steps) != 3 || !strings.Contains(out.String(), "installed") {
		t.Fatalf("build events: steps %q, output %q", steps, out.String())
	}
	if _, cached, err := e.m.BuildTemplate(ctx, "", "py", nil); err != nil || !cached {
		t.Fatalf("second build: cached=%v %v", cached, err)
	}
	// Layers: the directory is 0711, each layer's root private to host root.
	fi, err := os.Stat(filepath.Join(e.dir, "layers"))
	if err != nil || fi.Mode().Perm() != 0o711 {
		t.Fatalf("layers dir: %v %v", fi.Mode(), err)
	}
	dirs := e.layerDirs(t)
	if len(dirs) != 1 {
		t.Fatalf("layer dirs %v", dirs)
	}
	if fi, _ := os.Stat(filepath.Join(e.dir, "layers", dirs[0])); fi.Mode().Perm() != 0o700 {
		t.Fatalf("layer root mode %v", fi.Mode())
	}

	plain := timeIt(t, 3, func() { e.create(t, sandbox.Spec{IdleTimeout: -1}) })
	var sbs []sandbox.Sandbox
	fromTmpl := timeIt(t, 3, func() { sbs = append(sbs, e.create(t, sandbox.Spec{Template: "py", IdleTimeout: -1})) })
	t.Logf("create: plain %v, from a template %v (average of 3)", plain, fromTmpl)
	if fromTmpl > 2*plain+100*time.Millisecond {
		t.Errorf("creating from a template (%v) is much slower than a plain create (%v): is the layer copied?", fromTmpl, plain)
	}
	for i, sb := range sbs {
		if sb.Spec.Template != "py" || sb.Spec.Generation != tp.Generation {
			t.Fatalf("sandbox %d: template %q generation %q", i, sb.Spec.Template, sb.Spec.Generation)
		}
		got := e.sh(t, sb.ID, "tool ok; cat /opt/greeting notes/readme.txt ~/.agents/skills/x/SKILL.md; echo; pwd")
		if got != "tool ok\nhi\nseeded\nskill\n/workspace\n" {
			t.Fatalf("sandbox %d sees %q", i, got)
		}
		// An unprivileged user inside walks the stacked layer normally.
		if got := e.sh(t, sb.ID, "setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'ls / >/dev/null && tool nobody'"); got != "tool nobody\n" {
			t.Fatalf("as nobody: %q", got)
		}
	}
	e.sh(t, sbs[0].ID, "echo mine > /opt/greeting; echo mine > notes/readme.txt; rm /opt/tool/bin/tool")
	for _, sb := range sbs[1:] {
		if got := e.sh(t, sb.ID, "cat /opt/greeting notes/readme.txt; tool still"); got != "hi\nseeded\ntool still\n" {
			t.Fatalf("a write in another sandbox showed up: %q", got)
		}
	}
}

func timeIt(t *testing.T, n int, f func()) time.Duration {
	start := time.Now()
	for range n {
		f()
	}
	return time.Since(start) / time.Duration(n)
}

func TestTemplateConcurrentCreatesShareOneBuild(t *testing.T) {
	t.Parallel()
	e := openT(t, newDir(t))
	ctx := context.Background()
	e.put(t, "slow", sandbox.TemplateDef{Setup: []string{"sleep 0.5; date +%s%N > /built"}})
	var wg sync.WaitGroup
	ids := make([]string, 20)
	var failures atomic.Int32
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := e.m.Create(ctx, "", sandbox.Spec{Template: "slow", IdleTimeout: -1})
			if err != nil {
				t.Errorf("create %d: %v", i, err)
				failures.Add(1)
				return
			}
			ids[i] = sb.ID
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, id := range ids {
			if id != "" {
				_ = e.m.Delete(ctx, "", id)
			}
		}
	})
	if failures.Load() > 0 {
		t.FailNow()
	}
	if n := e.logs.count("template built"); n != 1 {
		t.Fatalf("%d builds for 20 concurrent creates, want 1", n)
	}
	first := e.sh(t, ids[0], "cat /built")
	for _, id := range ids[1:] {
		if got := e.sh(t, id, "cat /built"); got != first {
			t.Fatalf("sandboxes see different builds: %q vs %q", got, first)
		}
	}
	if dirs := e.layerDirs(t); len(dirs) != 1 {
		t.Fatalf("layer dirs after one build: %v", dirs)
	}
}

func TestTemplateBuildFailureThenFix(t *testing.T) {
	t.Parallel()
	e := openT(t, newDir(t))
	ctx := context.Background()
	e.put(t, "broken", sandbox.TemplateDef{Setup: []string{"echo step-one-ok", "echo oops-marker >&2; exit 3", "echo never"}})
	for try := 1; try <= 2; try++ {
		_, err := e.m.Create(ctx, "", sandbox.Spec{Template: "broken"})
		var be *sandbox.BuildError
		if !errors.As(err, &be) || !errors.Is(err, errdefs.ErrFailedPrecondition) || be.Step != 2 {
			t.Fatalf("try %d: %v", try, err)
		}
		if !strings.Contains(err.Error(), "oops-marker") || !strings.Contains(be.Log, "step-one-ok") || strings.Contains(be.Log, "never") {
			t.Fatalf("try %d: the error lacks the log: %v (log %q)", try, err, be.Log)
		}
		if n := e.logs.count("template build failed"); n != try {
			t.Fatalf("try %d: %d failed builds: a failure must be retried on the next request", try, n)
		}
	}
	tp, err := e.m.GetTemplate(ctx, "", "broken")
	if err != nil || tp.Status != sandbox.TemplateFailed || !strings.Contains(tp.Build.Log, "oops-marker") {
		t.Fatalf("template after a failed build: %+v %v", tp, err)
	}
	if dirs := e.layerDirs(t); len(dirs) != 0 {
		t.Fatalf("a failed build left %v", dirs)
	}
	e.put(t, "broken", sandbox.TemplateDef{Setup: []string{"echo step-one-ok", "echo fixed > /fixed"}})
	sb := e.create(t, sandbox.Spec{Template: "broken"})
	if got := e.sh(t, sb.ID, "cat /fixed"); got != "fixed\n" {
		t.Fatalf("after the fix: %q", got)
	}
}

func TestTemplateChangeAndGC(t *testing.T) {
	t.Parallel()
	e := openT(t, newDir(t))
	ctx := context.Background()
	e.put(t, "app", sandbox.TemplateDef{Setup: []string{"echo v1 > /opt/version"}})
	old, err := e.m.Create(ctx, "", sandbox.Spec{Template: "app", IdleTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	e.put(t, "app", sandbox.TemplateDef{Setup: []string{"echo v2 > /opt/version"}})
	if tp, _ := e.m.GetTemplate(ctx, "", "app"); tp.Generation != "" || tp.Status != sandbox.TemplateNone {
		t.Fatalf("a changed template still has generation %q (%s)", tp.Generation, tp.Status)
	}
	cur := e.create(t, sandbox.Spec{Template: "app", IdleTimeout: -1})
	if cur.Spec.Generation == old.Spec.Generation {
		t.Fatal("a changed template kept its generation")
	}
	if got := e.sh(t, cur.ID, "cat /opt/version"); got != "v2\n" {
		t.Fatalf("new sandbox: %q", got)
	}
	if gone, err := e.m.CollectLayers(ctx); err != nil || len(gone) != 0 {
		t.Fatalf("collected %v (%v) while a sandbox uses the old generation", gone, err)
	}
	if got := e.sh(t, old.ID, "cat /opt/version"); got != "v1\n" {
		t.Fatalf("old sandbox: %q", got)
	}
	if len(e.layerDirs(t)) != 2 {
		t.Fatalf("layer dirs %v, want both generations", e.layerDirs(t))
	}
	if err := e.m.Delete(ctx, "", old.ID); err != nil {
		t.Fatal(err)
	}
	// A destroy collects at once; an explicit collection finds the old
	// generation only if that one has not run yet.
	gone, err := e.m.CollectLayers(ctx)
	if err != nil || (len(gone) != 0 && !slices.Equal(gone, []string{old.Spec.Generation})) {
		t.Fatalf("collected %v (%v), want nothing or the old generation %s", gone, err, old.Spec.Generation)
	}
	if len(e.layerDirs(t)) != 1 {
		t.Fatalf("layer dirs %v after collecting the old generation", e.layerDirs(t))
	}
	// The current generation stays, used or not; deleting the template
	// lets it go once its last sandbox does.
	if err := e.m.Delete(ctx, "", cur.ID); err != nil {
		t.Fatal(err)
	}
	if gone, _ := e.m.CollectLayers(ctx); len(gone) != 0 {
		t.Fatalf("collected the current generation: %v", gone)
	}
	if err := e.m.DeleteTemplate(ctx, "", "app"); err != nil {
		t.Fatal(err)
	}
	// The manager's own collector may get there first: either way the
	// layer is gone within a collection.
	gone, _ = e.m.CollectLayers(ctx)
	for deadline := time.Now().Add(5 * time.Second); len(e.layerDirs(t)) != 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		_, _ = e.m.CollectLayers(ctx)
	}
	if len(gone) > 1 || len(e.layerDirs(t)) != 0 {
		t.Fatalf("after deleting the template: collected %v, left %v", gone, e.layerDirs(t))
	}
	if _, err := e.m.Create(ctx, "", sandbox.Spec{Template: "app"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("create from a deleted template: %v", err)
	}
}

// waitPool polls until a template's pool has n ready sandboxes.
func (e *tenv) waitPool(t *testing.T, tenant, name string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tp, err := e.m.GetTemplate(context.Background(), tenant, name)
		if err != nil {
			t.Fatal(err)
		}
		if tp.PoolReady == n {
			return e.pooledIDs(t, name)
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool of %s has %d ready, want %d", name, tp.PoolReady, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *tenv) pooledIDs(t *testing.T, name string) []string {
	sbs, _, err := e.m.List(context.Background(), "", sandbox.ListOptions{States: []sandbox.State{sandbox.Running},
		Labels: map[string]string{sandbox.PoolLabel: name}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range sbs {
		ids = append(ids, sb.ID)
	}
	return ids
}

func TestPoolClaimAndRefill(t *testing.T) {
	t.Parallel()
	e := openT(t, newDir(t))
	ctx := context.Background()
	e.putFor(t, "tenant-x", "warm", sandbox.TemplateDef{Setup: []string{"echo warm > /opt/w"}, Env: map[string]string{"A": "1"}})
	if _, err := e.m.SetPool(ctx, "tenant-x", "warm", 2); err != nil {
		t.Fatal(err)
	}
	pooled := e.waitPool(t, "tenant-x", "warm", 2)
	if len(pooled) != 2 {
		t.Fatalf("pooled sandboxes %v", pooled)
	}
	pb, _ := e.m.Get(ctx, "", pooled[0])
	if pb.Spec.IdleTimeout != -1 || pb.Spec.Pool == nil {
		t.Fatalf("a pooled sandbox: %+v", pb.Spec)
	}
	start := time.Now()
	sb, err := e.m.Create(ctx, "tenant-x", sandbox.Spec{Template: "warm", Env: map[string]string{"A": "1"},
		Labels: map[string]string{"who": "x"}, Timeout: time.Hour})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.m.Delete(ctx, "", sb.ID) })
	if !slices.Contains(pooled, sb.ID) {
		t.Fatalf("create took %s, not one of the pool %v", sb.ID, pooled)
	}
	t.Logf("claim took %v", took)
	if took > 50*time.Millisecond {
		t.Errorf("claiming a pooled sandbox took %v", took)
	}
	if sb.Tenant != "tenant-x" || sb.Spec.Labels["who"] != "x" || sb.Spec.Pool != nil || sb.Spec.IdleTimeout != 0 ||
		sb.Spec.Timeout != time.Hour || sb.Timers.Used(time.Now()) > time.Second {
		t.Fatalf("claimed sandbox: %+v", sb)
	}
	if _, err := e.m.Get(ctx, "other-tenant", sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant sees the claimed sandbox: %v", err)
	}
	if got := e.sh(t, sb.ID, "cat /opt/w; echo $A"); got != "warm\n1\n" {
		t.Fatalf("claimed sandbox: %q", got)
	}
	refilled := e.waitPool(t, "tenant-x", "warm", 2)
	if slices.Contains(refilled, sb.ID) {
		t.Fatalf("the claimed sandbox is still pooled: %v", refilled)
	}
	// A request the pool cannot honour (other env) is a plain create.
	other, err := e.m.Create(ctx, "tenant-x", sandbox.Spec{Template: "warm", Env: map[string]string{"A": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.m.Delete(ctx, "", other.ID) })
	if slices.Contains(refilled, other.ID) || e.sh(t, other.ID, "echo $A") != "2\n" {
		t.Fatalf("a create with other env got a pooled sandbox")
	}
	// Shrinking to 0 destroys the pool's sandboxes at once.
	if _, err := e.m.SetPool(ctx, "tenant-x", "warm", 0); err != nil {
		t.Fatal(err)
	}
	if ids := e.pooledIDs(t, "warm"); len(ids) != 0 {
		t.Fatalf("pool of 0 keeps %v", ids)
	}
	if _, err := e.m.SetPool(ctx, "tenant-x", "warm", 1000); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("pool of 1000: %v", err)
	}
}

func TestPoolSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	e := openT(t, dir)
	ctx := context.Background()
	e.putFor(t, "t", "kept", sandbox.TemplateDef{Setup: []string{"true"}})
	if _, err := e.m.SetPool(ctx, "t", "kept", 1); err != nil {
		t.Fatal(err)
	}
	before := e.waitPool(t, "t", "kept", 1)
	e.close()
	e2 := openT(t, dir)
	tp, err := e2.m.GetTemplate(ctx, "t", "kept")
	if err != nil || tp.PoolSize != 1 || tp.PoolReady != 1 {
		t.Fatalf("after a restart: %+v %v", tp, err)
	}
	sb, err := e2.m.Create(ctx, "t", sandbox.Spec{Template: "kept"})
	if err != nil || sb.ID != before[0] {
		t.Fatalf("claim after a restart: %v %v, want the adopted %s", sb.ID, err, before[0])
	}
	e2.sh(t, sb.ID, "true")
	e2.waitPool(t, "t", "kept", 1)
	if _, err := e2.m.SetPool(ctx, "t", "kept", 0); err != nil {
		t.Fatal(err)
	}
	_ = e2.m.Delete(ctx, "", sb.ID)
}

func TestSnapshotAndFork(t *testing.T) {
	t.Parallel()
	e := openT(t, newDir(t))
	ctx := context.Background()
	src := e.create(t, sandbox.Spec{IdleTimeout: -1, Env: map[string]string{"K": "v"}})
	e.sh(t, src.ID, "echo data > /workspace/f; mkdir -p /opt/x && echo bin > /opt/x/b; rm -f /etc/shells; sleep 300 >/dev/null 2>&1 &")
	forks, err := e.m.Fork(ctx, "", src.ID, sandbox.ForkOptions{Count: 2, Labels: map[string]string{"fork": "yes"}})
	if err != nil || len(forks) != 2 {
		t.Fatalf("fork: %v %v", forks, err)
	}
	for _, f := range forks {
		t.Cleanup(func() { _ = e.m.Delete(ctx, "", f.ID) })
		if f.Spec.ForkOf != src.ID || f.Spec.Labels["fork"] != "yes" {
			t.Fatalf("fork: %+v", f.Spec)
		}
		got := e.sh(t, f.ID, "cat /workspace/f /opt/x/b; echo $K; test -e /etc/shells && echo shells; pgrep sleep || echo no-sleep")
		if got != "data\nbin\nv\nno-sleep\n" {
			t.Fatalf("fork %s sees %q", f.ID, got)
		}
	}
	e.sh(t, forks[0].ID, "echo changed > /workspace/f")
	if got := e.sh(t, forks[1].ID, "cat /workspace/f"); got != "data\n" {
		t.Fatalf("a fork's write reached its sibling: %q", got)
	}
	if got := e.sh(t, src.ID, "cat /workspace/f; pgrep -c sleep"); got != "data\n1\n" {
		t.Fatalf("the source after forking: %q", got)
	}
	// A fork of a fork stacks both layers.
	e.sh(t, forks[0].ID, "echo second > /workspace/g")
	grand, err := e.m.Fork(ctx, "", forks[0].ID, sandbox.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.m.Delete(ctx, "", grand[0].ID) })
	if got := e.sh(t, grand[0].ID, "cat /workspace/f /workspace/g /opt/x/b"); got != "changed\nsecond\nbin\n" {
		t.Fatalf("fork of a fork: %q", got)
	}
	// Snapshot into a template; sandboxes from it see the files.
	tp, err := e.m.Snapshot(ctx, "", src.ID, "snap")
	if err != nil || tp.Generation == "" || tp.Def.Snapshot == nil {
		t.Fatalf("snapshot: %+v %v", tp, err)
	}
	sb := e.create(t, sandbox.Spec{Template: "snap"})
	if got := e.sh(t, sb.ID, "cat /workspace/f; echo $K"); got != "data\nv\n" {
		t.Fatalf("from the snapshot: %q", got)
	}
	e.put(t, "recipe", sandbox.TemplateDef{})
	if _, err := e.m.Snapshot(ctx, "", src.ID, "recipe"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("snapshot over a recipe template: %v", err)
	}
	if _, err := e.m.Fork(ctx, "", src.ID, sandbox.ForkOptions{Count: 100}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("fork of 100: %v", err)
	}
	if _, err := e.m.Fork(ctx, "someone-else", src.ID, sandbox.ForkOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant's fork: %v", err)
	}
	// The source goes; its forks keep their layers.
	if err := e.m.Delete(ctx, "", src.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.CollectLayers(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.sh(t, forks[1].ID, "cat /workspace/f"); got != "data\n" {
		t.Fatalf("a fork after its source went: %q", got)
	}
}

func TestTemplateValidation(t *testing.T) {
	t.Parallel()
	e := openT(t, newDir(t))
	ctx := context.Background()
	for name, def := range map[string]sandbox.TemplateDef{
		"Bad Name": {},
	} {
		if _, err := e.m.PutTemplate(ctx, "", name, def); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("name %q: %v", name, err)
		}
	}
	for i, def := range []sandbox.TemplateDef{
		{Setup: []string{""}},
		{Cwd: "relative"},
		{Files: []sandbox.TemplateFile{{Path: "/proc/x"}}},
		{Files: []sandbox.TemplateFile{{Path: "/"}}},
		{Files: []sandbox.TemplateFile{{Path: "/tmp/x"}}},
		{Files: []sandbox.TemplateFile{{Path: "a", Mode: 0o10000000}}},
		{Mounts: []sandbox.TemplateMount{{Path: "/opt/m", Source: "relative"}}},
		{Mounts: []sandbox.TemplateMount{{Path: "/opt/m", Source: "/does/not/exist"}}},
	} {
		if _, err := e.m.PutTemplate(ctx, "", "v", def); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("def %d %+v: %v", i, def, err)
		}
	}
	if _, err := e.m.GetTemplate(ctx, "", "v"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an invalid definition was stored: %v", err)
	}
	// Tenants have their own namespaces.
	if _, err := e.m.PutTemplate(ctx, "a", "same", sandbox.TemplateDef{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.GetTemplate(ctx, "b", "same"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("tenant b sees a's template: %v", err)
	}
	if _, err := e.m.Create(ctx, "b", sandbox.Spec{Template: "same"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("tenant b creates from a's template: %v", err)
	}
	all, _ := e.m.ListTemplates(ctx, "", true)
	mine, _ := e.m.ListTemplates(ctx, "b", false)
	if len(all) != 1 || len(mine) != 0 {
		t.Fatalf("lists: all %d, b's %d", len(all), len(mine))
	}
}

// TestTemplateMountAndRestartClean: a host tree is copied in at build time
// and a change to it makes a new generation; a build sandbox left by a
// crash is destroyed at the next start.
func TestTemplateMountAndRestartClean(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	e := openT(t, dir)
	ctx := context.Background()
	skills := filepath.Join(t.TempDir(), "skills")
	if err := os.MkdirAll(filepath.Join(skills, "pdf"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(skills, "pdf", "SKILL.md"), []byte("read pdfs"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.put(t, "agent", sandbox.TemplateDef{Mounts: []sandbox.TemplateMount{{Path: "$HOME/.agents/skills", Source: skills}}})
	a := e.mustCreate(t, sandbox.Spec{Template: "agent"})
	if got := e.sh(t, a.ID, "cat ~/.agents/skills/pdf/SKILL.md"); got != "read pdfs" {
		t.Fatalf("mounted tree: %q", got)
	}
	if err := os.WriteFile(filepath.Join(skills, "pdf", "SKILL.md"), []byte("read pdfs, v2"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := e.mustCreate(t, sandbox.Spec{Template: "agent"})
	if b.Spec.Generation == a.Spec.Generation || e.sh(t, b.ID, "cat ~/.agents/skills/pdf/SKILL.md") != "read pdfs, v2" {
		t.Fatalf("a changed host tree did not make a new generation")
	}
	if got := e.sh(t, a.ID, "cat ~/.agents/skills/pdf/SKILL.md"); got != "read pdfs" {
		t.Fatalf("the old sandbox's tree changed: %q", got)
	}
	// A crash leaves a build sandbox and a half-written layer.
	if _, err := e.be.Create(ctx, backend.Spec{ID: "bld-deadbeef"}); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(dir, "layers", ".build-bld-deadbeef"), nil, 0o600)
	_ = os.Mkdir(filepath.Join(dir, "layers", ".tmp-x"), 0o700)
	e.close()
	e2 := openT(t, dir)
	if _, err := os.Stat(filepath.Join(dir, "sandboxes", "bld-deadbeef")); err == nil {
		t.Fatal("a crashed build's sandbox survived the restart")
	}
	if dirs := e2.layerDirs(t); len(dirs) != 2 {
		t.Fatalf("layer dir after restart: %v", dirs)
	}
	_ = e2.m.Delete(ctx, "", a.ID)
	_ = e2.m.Delete(ctx, "", b.ID)
}

// mustCreate creates without a cleanup (for tests that restart the manager).
func (e *tenv) mustCreate(t *testing.T, spec sandbox.Spec) sandbox.Sandbox {
	t.Helper()
	sb, err := e.m.Create(context.Background(), "", spec)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}
