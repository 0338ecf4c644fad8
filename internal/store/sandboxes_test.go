package store

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

func newSandbox(id, tenant string) Sandbox {
	return Sandbox{
		ID: id, Tenant: tenant, State: "creating",
		Spec:     json.RawMessage(`{"base":"host","limits":{"memory":"1G"}}`),
		Labels:   map[string]string{"env": "dev", "team": "core"},
		Metadata: map[string]string{"note": "hi"},
	}
}

func TestInsertAndGet(t *testing.T) {
	s, _ := openTest(t)
	clk := newClock(s)
	ctx := context.Background()
	in := newSandbox("sb_1", "acme")
	in.Version, in.Created = 42, time.Unix(1, 0) // ignored: the store sets them
	got, err := s.InsertSandbox(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 1 || !got.Created.Equal(clk.now()) || !got.Updated.Equal(clk.now()) {
		t.Fatalf("inserted %+v", got)
	}
	if string(got.Spec) != string(in.Spec) || !reflect.DeepEqual(got.Labels, in.Labels) ||
		!reflect.DeepEqual(got.Metadata, in.Metadata) || got.Handle != nil || got.Extra != nil {
		t.Fatalf("inserted %+v, from %+v", got, in)
	}
	for _, tenant := range []string{"acme", ""} {
		read, err := s.GetSandbox(ctx, tenant, "sb_1")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(read, got) {
			t.Fatalf("GetSandbox(%q) = %+v\nInsertSandbox returned %+v", tenant, read, got)
		}
	}
}

func TestInsertDuplicate(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	must[Sandbox](t)(s.InsertSandbox(ctx, newSandbox("sb_1", "acme")))
	dup := newSandbox("sb_1", "other")
	dup.Labels = map[string]string{"x": "y"}
	_, err := s.InsertSandbox(ctx, dup)
	wantErr(t, err, errdefs.ErrAlreadyExists)
	got := must[Sandbox](t)(s.GetSandbox(ctx, "", "sb_1"))
	if got.Tenant != "acme" || got.Labels["x"] != "" {
		t.Fatalf("the failed insert changed the row: %+v", got)
	}
	var n int
	s.r.QueryRow(`SELECT count(*) FROM sandbox_labels WHERE key = 'x'`).Scan(&n)
	if n != 0 {
		t.Fatal("the failed insert left label rows")
	}
}

func TestInsertInvalid(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	for name, sb := range map[string]Sandbox{
		"no id":      {State: "creating"},
		"no state":   {ID: "x"},
		"bad spec":   {ID: "x", State: "s", Spec: json.RawMessage(`{"a":`)},
		"bad handle": {ID: "x", State: "s", Handle: json.RawMessage(`nope`)},
		"bad extra":  {ID: "x", State: "s", Extra: json.RawMessage(`{}}`)},
		"bad label":  {ID: "x", State: "s", Labels: map[string]string{"k": "\xff"}},
	} {
		_, err := s.InsertSandbox(ctx, sb)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: error = %v, want invalid argument", name, err)
		}
	}
}

func TestGetAcrossTenants(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	must[Sandbox](t)(s.InsertSandbox(ctx, newSandbox("sb_1", "acme")))
	_, errOther := s.GetSandbox(ctx, "evil", "sb_1")
	_, errMissing := s.GetSandbox(ctx, "evil", "sb_2")
	wantErr(t, errOther, errdefs.ErrNotFound)
	wantErr(t, errMissing, errdefs.ErrNotFound)
	// Indistinguishable: same class, same shape of message.
	if errOther.Error() != `store: sandbox "sb_1": not found` || errMissing.Error() != `store: sandbox "sb_2": not found` {
		t.Fatalf("errors differ in shape: %q vs %q", errOther, errMissing)
	}
}

func TestUpdateSandbox(t *testing.T) {
	s, _ := openTest(t)
	clk := newClock(s)
	ctx := context.Background()
	v1 := must[Sandbox](t)(s.InsertSandbox(ctx, newSandbox("sb_1", "acme")))
	clk.advance(time.Second)
	next := v1
	next.State, next.Reason = "running", "started"
	next.Handle = json.RawMessage(`{"pid":42}`)
	next.Extra = json.RawMessage(`{"idle_timeout":"5m"}`)
	next.Labels = map[string]string{"env": "prod"}
	next.Metadata = nil
	next.Tenant = "evil" // immutable: ignored
	v2, err := s.UpdateSandbox(ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	if v2.Version != 2 || v2.State != "running" || v2.Reason != "started" || v2.Tenant != "acme" ||
		string(v2.Handle) != `{"pid":42}` || string(v2.Extra) != `{"idle_timeout":"5m"}` ||
		!reflect.DeepEqual(v2.Labels, map[string]string{"env": "prod"}) || v2.Metadata != nil ||
		!v2.Created.Equal(v1.Created) || !v2.Updated.Equal(clk.now()) {
		t.Fatalf("updated %+v", v2)
	}
	if got := must[Sandbox](t)(s.GetSandbox(ctx, "acme", "sb_1")); !reflect.DeepEqual(got, v2) {
		t.Fatalf("GetSandbox = %+v\nUpdateSandbox returned %+v", got, v2)
	}
	// The searchable label copy follows the update.
	for labels, want := range map[string]int{"env=prod": 1, "env=dev": 0, "team=core": 0} {
		k, v, _ := strings.Cut(labels, "=")
		page, _ := must2List(t)(s.ListSandboxes(ctx, ListFilter{Labels: map[string]string{k: v}}))
		if len(page) != want {
			t.Errorf("label %s matches %d, want %d", labels, len(page), want)
		}
	}

	stale := v1 // still at version 1
	stale.State = "dead"
	_, err = s.UpdateSandbox(ctx, stale)
	wantErr(t, err, errdefs.ErrConflict)
	if got := must[Sandbox](t)(s.GetSandbox(ctx, "", "sb_1")); !reflect.DeepEqual(got, v2) {
		t.Fatalf("a stale update changed the row: %+v", got)
	}
	missing := v2
	missing.ID = "sb_nope"
	_, err = s.UpdateSandbox(ctx, missing)
	wantErr(t, err, errdefs.ErrNotFound)
}

func TestDeleteSandbox(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	must[Sandbox](t)(s.InsertSandbox(ctx, newSandbox("sb_1", "acme")))
	for range 2 { // idempotent
		if err := s.DeleteSandbox(ctx, "sb_1"); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.GetSandbox(ctx, "", "sb_1")
	wantErr(t, err, errdefs.ErrNotFound)
	var n int
	s.r.QueryRow(`SELECT count(*) FROM sandbox_labels`).Scan(&n)
	if n != 0 {
		t.Fatalf("%d label rows outlived their sandbox", n)
	}
	// The ID is free again.
	must[Sandbox](t)(s.InsertSandbox(ctx, newSandbox("sb_1", "acme")))
}

func must2List(t testing.TB) func([]Sandbox, string, error) ([]Sandbox, string) {
	return func(sbs []Sandbox, tok string, err error) ([]Sandbox, string) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return sbs, tok
	}
}
