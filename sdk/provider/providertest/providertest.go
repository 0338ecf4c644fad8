// Package providertest is the behaviour every provider.Provider shares,
// as a test suite: run it against a provider to check that code written
// for one works on it.
package providertest

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/sdk/provider"
)

// Run creates sandboxes with p and checks exec, files and the lifecycle.
// Everything it creates is destroyed when the test ends.
func Run(t *testing.T, p provider.Provider) {
	ctx := t.Context()
	sb, err := p.Create(ctx, provider.CreateOptions{Env: map[string]string{"FROM_CREATE": "c"},
		Metadata: map[string]string{"suite": "providertest"}, Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatalf("%s: create: %v", p.Name(), err)
	}
	t.Cleanup(func() { _ = p.Destroy(context.WithoutCancel(ctx), sb.ID()) })
	t.Run("exec", func(t *testing.T) { testExec(t, sb) })
	t.Run("files", func(t *testing.T) { testFiles(t, sb) })
	t.Run("lifecycle", func(t *testing.T) { testLifecycle(t, p, sb) })
}

func testExec(t *testing.T, sb provider.Sandbox) {
	ctx := t.Context()
	res, err := sb.Exec(ctx, `echo "$FROM_CREATE $FOO $(pwd)"; echo err >&2; exit 3`,
		provider.ExecOptions{Env: map[string]string{"FOO": "foo"}, Cwd: "/tmp"})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode == nil || *res.ExitCode != 3 || string(res.Stdout) != "c foo /tmp\n" || string(res.Stderr) != "err\n" || res.TimedOut {
		t.Fatalf("exec: exit %v, stdout %q, stderr %q, timed out %v", res.ExitCode, res.Stdout, res.Stderr, res.TimedOut)
	}

	res, err = sb.Exec(ctx, "tr a-z A-Z", provider.ExecOptions{Stdin: []byte("from stdin\n")})
	if err != nil || string(res.Stdout) != "FROM STDIN\n" {
		t.Fatalf("stdin: %q %v", res.Stdout, err)
	}

	var mu sync.Mutex
	var seen bytes.Buffer
	res, err = sb.Exec(ctx, "for i in 1 2 3; do echo $i; done", provider.ExecOptions{OnData: func(s provider.Stream, b []byte) {
		mu.Lock()
		defer mu.Unlock()
		if s == provider.Stdout {
			seen.Write(b)
		}
	}})
	if err != nil || seen.String() != "1\n2\n3\n" || string(res.Stdout) != "1\n2\n3\n" {
		t.Fatalf("OnData saw %q, result %q, %v", seen.String(), res.Stdout, err)
	}

	start := time.Now()
	res, err = sb.Exec(ctx, "sleep 30", provider.ExecOptions{Timeout: time.Second})
	if err != nil || !res.TimedOut || res.ExitCode != nil {
		t.Fatalf("timeout: %+v %v", res, err)
	}
	if time.Since(start) > 15*time.Second {
		t.Fatalf("a 1s timeout took %v", time.Since(start))
	}
}

func testFiles(t *testing.T, sb provider.Sandbox) {
	ctx := t.Context()
	if err := sb.WriteFile(ctx, "pt/deep/a.txt", []byte("alpha")); err != nil {
		t.Fatal(err)
	}
	if b, err := sb.ReadFile(ctx, "pt/deep/a.txt"); err != nil || string(b) != "alpha" {
		t.Fatalf("read: %q %v", b, err)
	}
	if _, err := sb.ReadFile(ctx, "pt/missing"); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("read missing: %v, want ErrNotFound", err)
	}
	fi, err := sb.Stat(ctx, "pt/deep/a.txt")
	if err != nil || fi.Name != "a.txt" || fi.Size != 5 || fi.IsDir || !strings.HasSuffix(fi.Path, "/pt/deep/a.txt") || fi.ModTime.IsZero() {
		t.Fatalf("stat: %+v %v", fi, err)
	}
	for range 2 { // the second time it exists: still no error
		if err := sb.Mkdir(ctx, "pt/made/here"); err != nil {
			t.Fatal(err)
		}
	}
	if err := sb.WriteFile(ctx, "pt/b.txt", []byte("beta")); err != nil {
		t.Fatal(err)
	}
	list, err := sb.ReadDir(ctx, "pt")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range list {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	if strings.Join(names, " ") != "b.txt deep made" {
		t.Fatalf("readdir: %v", names)
	}
	if ok, err := sb.Exists(ctx, "pt/b.txt"); err != nil || !ok {
		t.Fatalf("exists: %v %v", ok, err)
	}
	if err := sb.Remove(ctx, "pt/deep"); err != nil {
		t.Fatal(err)
	}
	if err := sb.Remove(ctx, "pt/deep"); err != nil {
		t.Fatalf("removing a missing path: %v", err)
	}
	if ok, err := sb.Exists(ctx, "pt/deep/a.txt"); err != nil || ok {
		t.Fatalf("exists after remove: %v %v", ok, err)
	}
}

func testLifecycle(t *testing.T, p provider.Provider, sb provider.Sandbox) {
	ctx := t.Context()
	if err := sb.WriteFile(ctx, "keep.txt", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	if err := p.Suspend(ctx, sb.ID()); err != nil {
		t.Fatalf("suspend: %v", err)
	}
	back, err := p.Connect(ctx, sb.ID())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if b, err := back.ReadFile(ctx, "keep.txt"); err != nil || string(b) != "kept" {
		t.Fatalf("after suspend and connect: %q %v", b, err)
	}
	if res, err := back.Exec(ctx, "cat keep.txt", provider.ExecOptions{Cwd: pathDir(ctx, back)}); err != nil || string(res.Stdout) != "kept" {
		t.Fatalf("exec after connect: %q %v", res.Stdout, err)
	}
	if err := p.Destroy(ctx, sb.ID()); err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(ctx, sb.ID()); err != nil {
		t.Fatalf("destroying twice: %v", err)
	}
	if _, err := p.Connect(ctx, sb.ID()); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("connect to a destroyed sandbox: %v, want ErrNotFound", err)
	}
}

// pathDir is the directory relative paths resolve to, as the provider
// reports it, so a shell command can find a file written by a relative
// path.
func pathDir(ctx context.Context, sb provider.Sandbox) string {
	fi, err := sb.Stat(ctx, "keep.txt")
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(fi.Path, "/keep.txt")
}
