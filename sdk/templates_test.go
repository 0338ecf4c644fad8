package hutch_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/daemon/daemontest"
	hutch "github.com/hutch-dev/hutch/sdk"
)

func TestTemplates(t *testing.T) {
	d := daemontest.Start(t)
	c, err := hutch.New("unix://"+d.Socket, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	def := hutch.TemplateDefinition{Setup: []string{"echo building; echo v1 > /opt/v"},
		Files: []hutch.TemplateFile{{Path: "bin.dat", Content: []byte{0xff, 0, 1}, Mode: 0o600}, {Path: "~/note", Content: []byte("n")}},
		Env:   map[string]string{"E": "1"}}
	tp, err := c.PutTemplate(ctx, "sdk-t", def)
	if err != nil || tp.Status != hutch.TemplateNone || len(tp.Files) != 2 || tp.Files[0].Mode != 0o600 || tp.Files[1].Path != "/root/note" {
		t.Fatalf("put: %+v %v", tp, err)
	}
	var out strings.Builder
	var steps int
	tp, err = c.BuildTemplate(ctx, "sdk-t", func(ev hutch.BuildEvent) {
		if ev.Type == "step" {
			steps++
		}
		out.Write(ev.Data)
	})
	if err != nil || tp.Status != hutch.TemplateReady || tp.Generation == "" || steps != 2 || out.String() != "building\n" {
		t.Fatalf("build: %+v %v (steps %d, output %q)", tp, err, steps, out.String())
	}
	sb, err := c.Create(ctx, hutch.CreateOptions{Template: "sdk-t"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(context.Background())
	if sb.Template != "sdk-t" || sb.Generation != tp.Generation || sb.Env["E"] != "1" {
		t.Fatalf("sandbox: %+v", sb)
	}
	res, err := sb.Exec(ctx, "cat /opt/v ~/note; od -An -tx1 bin.dat")
	if err != nil || string(res.Stdout) != "v1\nn ff 00 01\n" {
		t.Fatalf("exec: %q %v", res.Stdout, err)
	}

	// Fork and snapshot.
	if _, err := sb.Exec(ctx, "echo mine > /workspace/m"); err != nil {
		t.Fatal(err)
	}
	forks, err := sb.Fork(ctx, hutch.ForkOptions{Count: 2, Labels: map[string]string{"x": "y"}})
	if err != nil || len(forks) != 2 || forks[0].ForkedFrom != sb.ID || forks[0].Labels["x"] != "y" {
		t.Fatalf("fork: %+v %v", forks, err)
	}
	for _, f := range forks {
		defer f.Delete(context.Background())
		if res, err := f.Exec(ctx, "cat /workspace/m"); err != nil || string(res.Stdout) != "mine\n" {
			t.Fatalf("fork: %q %v", res.Stdout, err)
		}
	}
	snap, err := sb.Snapshot(ctx, "sdk-snap")
	if err != nil || snap.Kind != "snapshot" || snap.SnapshotOf != sb.ID {
		t.Fatalf("snapshot: %+v %v", snap, err)
	}

	// A pool.
	if tp, err = c.SetTemplatePool(ctx, "sdk-snap", 1); err != nil || tp.PoolSize != 1 {
		t.Fatalf("pool: %+v %v", tp, err)
	}
	defer c.SetTemplatePool(context.Background(), "sdk-snap", 0)
	for tp.PoolReady != 1 {
		time.Sleep(20 * time.Millisecond)
		if tp, err = c.GetTemplate(ctx, "sdk-snap"); err != nil {
			t.Fatal(err)
		}
	}
	if tp, err = c.SetTemplatePool(ctx, "sdk-snap", 0); err != nil || tp.PoolReady != 0 {
		t.Fatalf("pool of 0: %+v %v", tp, err)
	}

	// Errors carry the daemon's classes; a failed build its log.
	if _, err := c.PutTemplate(ctx, "sdk-bad", hutch.TemplateDefinition{Setup: []string{"echo log-line; false"}}); err != nil {
		t.Fatal(err)
	}
	_, err = c.BuildTemplate(ctx, "sdk-bad", nil)
	var he *hutch.Error
	if !errors.Is(err, hutch.ErrFailedPrecondition) || !errors.As(err, &he) || !strings.Contains(he.Message, "log-line") {
		t.Fatalf("failed build: %v", err)
	}
	if _, err := c.GetTemplate(ctx, "nope"); !errors.Is(err, hutch.ErrNotFound) {
		t.Fatalf("missing template: %v", err)
	}
	if _, err := c.BuildTemplate(ctx, "nope", nil); !errors.Is(err, hutch.ErrNotFound) {
		t.Fatalf("build of a missing template: %v", err)
	}
	ts, err := c.ListTemplates(ctx)
	if err != nil || len(ts) != 3 {
		t.Fatalf("list: %+v %v", ts, err)
	}
	for _, name := range []string{"sdk-t", "sdk-snap", "sdk-bad"} {
		if err := c.DeleteTemplate(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteTemplate(ctx, "sdk-t"); !errors.Is(err, hutch.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
}
