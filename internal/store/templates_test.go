package store

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

func TestTemplatesPerTenant(t *testing.T) {
	t.Parallel()
	s, _ := openTest(t)
	c := newClock(s)
	ctx := context.Background()
	a := must[Template](t)(s.PutTemplate(ctx, Template{Tenant: "a", Name: "py", Spec: json.RawMessage(`{"setup":["x"]}`)}))
	if a.Generation != "" || a.PoolSize != 0 || !a.Created.Equal(c.now()) {
		t.Fatalf("put: %+v", a)
	}
	c.advance(time.Second)
	a.Generation, a.PoolSize, a.Build = "g-1", 2, json.RawMessage(`{"state":"ready"}`)
	b := must[Template](t)(s.PutTemplate(ctx, a))
	if b.Generation != "g-1" || b.PoolSize != 2 || !b.Created.Equal(a.Created) || !b.Updated.After(a.Updated) || string(b.Build) != `{"state":"ready"}` {
		t.Fatalf("replace: %+v", b)
	}
	must[Template](t)(s.PutTemplate(ctx, Template{Tenant: "b", Name: "py", Spec: json.RawMessage(`{}`)}))
	must[Template](t)(s.PutTemplate(ctx, Template{Tenant: "", Name: "admin", Spec: json.RawMessage(`{}`)}))
	if got := must[Template](t)(s.GetTemplate(ctx, "b", "py")); string(got.Spec) != `{}` {
		t.Fatalf("b's py: %s", got.Spec)
	}
	_, err := s.GetTemplate(ctx, "", "py") // "" is a tenant of its own, not a wildcard
	wantErr(t, err, errdefs.ErrNotFound)
	_, err = s.GetTemplate(ctx, "c", "py")
	wantErr(t, err, errdefs.ErrNotFound)
	names := func(ts []Template) (out []string) {
		for _, t := range ts {
			out = append(out, t.Tenant+"/"+t.Name)
		}
		return out
	}
	if got := names(must[[]Template](t)(s.ListTemplates(ctx, "a", false))); !slices.Equal(got, []string{"a/py"}) {
		t.Fatalf("a's list: %v", got)
	}
	if got := names(must[[]Template](t)(s.ListTemplates(ctx, "", true))); !slices.Equal(got, []string{"/admin", "a/py", "b/py"}) {
		t.Fatalf("all: %v", got)
	}
	if err := s.DeleteTemplate(ctx, "a", "py"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, s.DeleteTemplate(ctx, "a", "py"), errdefs.ErrNotFound)
	must[Template](t)(s.GetTemplate(ctx, "b", "py"))
	_, err = s.PutTemplate(ctx, Template{Tenant: "a", Name: "x", Spec: json.RawMessage(`{bad`)})
	wantErr(t, err, errdefs.ErrInvalidArgument)
	_, err = s.PutTemplate(ctx, Template{Tenant: "a", Name: "x"})
	wantErr(t, err, errdefs.ErrInvalidArgument)
}

func TestLayersAndSpecStrings(t *testing.T) {
	t.Parallel()
	s, _ := openTest(t)
	ctx := context.Background()
	l := Layer{ID: "g-1", Tenant: "a", Dir: "d1", Template: "py", Kind: "build", Chain: []string{"d1"}, Bytes: 10, Files: 2}
	if err := s.PutLayer(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := s.PutLayer(ctx, Layer{ID: "f-2", Dir: "d2", Kind: "fork", Chain: []string{"d1", "d2"}}); err != nil {
		t.Fatal(err)
	}
	got := must[Layer](t)(s.GetLayer(ctx, "g-1"))
	if got.Dir != "d1" || got.Bytes != 10 || !slices.Equal(got.Chain, []string{"d1"}) {
		t.Fatalf("layer: %+v", got)
	}
	if ls := must[[]Layer](t)(s.ListLayers(ctx)); len(ls) != 2 || !slices.Equal(ls[1].Chain, []string{"d1", "d2"}) {
		t.Fatalf("layers: %+v", ls)
	}
	if err := s.PutLayer(ctx, Layer{ID: "g-3", Dir: "d1", Kind: "build"}); err == nil {
		t.Fatal("two layers share a directory")
	}
	if err := s.DeleteLayer(ctx, "g-1"); err != nil {
		t.Fatal(err)
	}
	_, err := s.GetLayer(ctx, "g-1")
	wantErr(t, err, errdefs.ErrNotFound)

	for i, sb := range []Sandbox{
		{ID: "s1", State: "running", Spec: json.RawMessage(`{"layers":["/l/d1","/l/d2"]}`)},
		{ID: "s2", State: "retired", Spec: json.RawMessage(`{"layers":["/l/d3"]}`)},
		{ID: "s3", State: "destroyed", Spec: json.RawMessage(`{"layers":["/l/d4"]}`)},
		{ID: "s4", State: "running", Spec: json.RawMessage(`{"layers":[1, {"x":2}]}`)},
		{ID: "s5", State: "running"},
	} {
		if _, err := s.InsertSandbox(ctx, sb); err != nil {
			t.Fatal(i, err)
		}
	}
	vals := must[[]string](t)(s.SpecStrings(ctx, "$.layers", "destroyed"))
	slices.Sort(vals)
	if !slices.Equal(vals, []string{"/l/d1", "/l/d2", "/l/d3"}) {
		t.Fatalf("layers in use: %v", vals)
	}
}

func TestReassignSandbox(t *testing.T) {
	t.Parallel()
	s, _ := openTest(t)
	c := newClock(s)
	ctx := context.Background()
	sb := must[Sandbox](t)(s.InsertSandbox(ctx, Sandbox{ID: "p1", State: "running", Spec: json.RawMessage(`{}`),
		Labels: map[string]string{"hutch.pool": "py"}}))
	c.advance(time.Minute)
	sb.Tenant, sb.Labels, sb.Metadata = "t1", map[string]string{"who": "t1"}, map[string]string{"m": "1"}
	got := must[Sandbox](t)(s.ReassignSandbox(ctx, sb))
	if got.Tenant != "t1" || got.Labels["who"] != "t1" || got.Labels["hutch.pool"] != "" || !got.Created.Equal(c.now()) || got.Version != 2 {
		t.Fatalf("reassigned: %+v", got)
	}
	if _, err := s.GetSandbox(ctx, "other", "p1"); err == nil {
		t.Fatal("another tenant sees the reassigned sandbox")
	}
	list, _, err := s.ListSandboxes(ctx, ListFilter{Labels: map[string]string{"hutch.pool": "py"}})
	if err != nil || len(list) != 0 {
		t.Fatalf("the old label is still searchable: %v %v", list, err)
	}
	_, err = s.ReassignSandbox(ctx, sb) // stale version
	wantErr(t, err, errdefs.ErrConflict)
	sb.ID = "missing"
	_, err = s.ReassignSandbox(ctx, sb)
	wantErr(t, err, errdefs.ErrNotFound)
}
