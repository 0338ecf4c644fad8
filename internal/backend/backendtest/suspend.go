package backendtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// fillTree makes files of every kind a writable layer must keep, in
// /workspace and outside it, and prints a manifest of them.
const fillTree = `set -e
mkdir -p /workspace/proj/empty /opt/tool/bin /etc/hutch-test
printf 'hello' > /workspace/proj/a.txt
head -c 300000 /dev/urandom > /workspace/proj/blob.bin
ln -sf a.txt /workspace/proj/link
ln -f /workspace/proj/a.txt /workspace/proj/hard
printf '#!/bin/sh\necho tool\n' > /opt/tool/bin/tool && chmod 4755 /opt/tool/bin/tool
chmod 0600 /workspace/proj/a.txt
chmod 1777 /workspace/proj/empty
echo conf > /etc/hutch-test/conf
rm -f /etc/shells; rm -rf /etc/ssl/certs; mkdir /etc/ssl/certs; echo mine > /etc/ssl/certs/only
`

// treeSum checksums the whole root filesystem of the sandbox that lives on
// its overlay (-xdev leaves out /proc, /dev, /tmp and read-only host
// binds): every path with its type, mode, owner, size and link target, and
// every file's content.
const treeSum = `cd / && find / -xdev -printf '%p %y %m %U:%G %s %l\n' | sort | md5sum && ` +
	`find / -xdev -type f -print0 | sort -z | xargs -0 md5sum | md5sum`

const manifest = `cd / && for p in /workspace/proj /workspace/proj/empty /workspace/proj/a.txt /workspace/proj/blob.bin ` +
	`/workspace/proj/link /workspace/proj/hard /opt/tool/bin/tool /etc/hutch-test/conf; do ` +
	`stat -c '%n %F %a %u:%g %s %h' $p; done; readlink /workspace/proj/link; ` +
	`md5sum /workspace/proj/blob.bin /workspace/proj/a.txt /etc/hutch-test/conf /opt/tool/bin/tool; ` +
	`test -e /etc/shells && echo shells-present || echo shells-absent; ls /etc/ssl/certs`

func testSuspend(t *testing.T, b backend.Backend) {
	sus, ok := b.(backend.Suspender)
	if !ok {
		t.Skip("backend has no Suspender capability")
	}
	ctx := context.Background()
	id := NewID("susp")
	Create(t, b, backend.Spec{ID: id})
	Sh(t, b, id, fillTree)
	for cycle := 1; cycle <= 20; cycle++ {
		want := Sh(t, b, id, treeSum+" && "+manifest)
		var buf bytes.Buffer
		st, err := sus.Suspend(ctx, id, func(r io.Reader) error { _, err := io.Copy(&buf, r); return err })
		if err != nil {
			t.Fatalf("cycle %d: suspend: %v", cycle, err)
		}
		if st.Compressed != int64(buf.Len()) || st.SHA256 == "" {
			t.Fatalf("cycle %d: stats %+v for %d bytes", cycle, st, buf.Len())
		}
		if info, _ := b.Inspect(ctx, id); info.Status != backend.StatusStopped {
			t.Fatalf("cycle %d: status after suspend %q", cycle, info.Status)
		}
		if _, err := sus.Resume(ctx, id, &buf); err != nil {
			t.Fatalf("cycle %d: resume: %v", cycle, err)
		}
		if got := Sh(t, b, id, treeSum+" && "+manifest); got != want {
			t.Fatalf("cycle %d: the tree changed:\n--- before\n%s\n--- after\n%s", cycle, want, got)
		}
		Sh(t, b, id, fmt.Sprintf("echo %d >> /workspace/cycles", cycle))
	}
	if got := strings.Count(Sh(t, b, id, "cat /workspace/cycles"), "\n"); got != 20 {
		t.Fatalf("a file appended each cycle has %d lines, want 20", got)
	}
}

// failingWriter accepts n bytes, then refuses with a class.
type failingWriter struct{ n int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		return 0, fmt.Errorf("archive over its size cap: %w", errdefs.ErrResourceExhausted)
	}
	w.n -= len(p)
	return len(p), nil
}

func testSuspendOverCap(t *testing.T, b backend.Backend) {
	sus, ok := b.(backend.Suspender)
	if !ok {
		t.Skip("backend has no Suspender capability")
	}
	ctx := context.Background()
	id := NewID("cap")
	Create(t, b, backend.Spec{ID: id})
	Sh(t, b, id, "head -c 2000000 /dev/urandom > /workspace/big; sleep 300 >/dev/null 2>&1 &")
	store := func(r io.Reader) error { _, err := io.Copy(&failingWriter{n: 64 << 10}, r); return err }
	_, err := sus.Suspend(ctx, id, store)
	WantErr(t, "suspend over the cap", err, errdefs.ErrResourceExhausted)
	if info, _ := b.Inspect(ctx, id); info.Status != backend.StatusRunning {
		t.Fatalf("status after a failed suspend %q, want running", info.Status)
	}
	if got := Sh(t, b, id, "pgrep -c sleep; stat -c %s /workspace/big"); got != "1\n2000000\n" {
		t.Fatalf("after a failed suspend: %q (the process and file must be intact)", got)
	}
}

func testSnapshot(t *testing.T, h Harness, b backend.Backend) {
	sn, ok := b.(backend.Snapshotter)
	if !ok {
		t.Skip("backend has no Snapshotter capability")
	}
	if h.LayerDir == nil {
		t.Skip("harness gave no place for layers")
	}
	ctx := context.Background()
	id := NewID("snap")
	Create(t, b, backend.Spec{ID: id})
	Sh(t, b, id, fillTree+"sleep 300 >/dev/null 2>&1 &")
	want := Sh(t, b, id, manifest)
	dst := h.LayerDir(t) + "/layer"
	if _, err := sn.Snapshot(ctx, id, dst); err != nil {
		t.Fatal(err)
	}
	if got := Sh(t, b, id, "pgrep -c sleep"); got != "1\n" {
		t.Fatalf("the snapshotted sandbox's process: %q", got)
	}
	// Two forks stack the layer; each gets its own writable copy.
	for i := range 2 {
		fork := NewID(fmt.Sprintf("fork%d", i))
		Create(t, b, backend.Spec{ID: fork, Layers: []string{dst}})
		if got := Sh(t, b, fork, manifest); got != want {
			t.Fatalf("fork %d differs:\n--- source\n%s\n--- fork\n%s", i, want, got)
		}
		Sh(t, b, fork, "echo fork > /workspace/proj/a.txt; pgrep sleep || true")
		if got := Sh(t, b, id, "cat /workspace/proj/a.txt"); got != "hello" {
			t.Fatalf("a fork's write reached the source: %q", got)
		}
	}
}
