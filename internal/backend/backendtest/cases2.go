package backendtest

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

func errorsIs(err, target error) bool { return errors.Is(err, target) }

func testFiles(t *testing.T, h Harness, b backend.Backend) {
	fa, ok := b.(backend.FileAccessor)
	if !ok {
		t.Skip("backend has no FileAccessor capability")
	}
	ctx := context.Background()
	id := NewID("files")
	Create(t, b, backend.Spec{ID: id})
	t.Run("WriteReadStat", func(t *testing.T) {
		if err := fa.WriteFile(ctx, id, "a/b/c.txt", 0o640, strings.NewReader("hello")); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t)(fa.ReadFile(ctx, id, "/workspace/a/b/c.txt")); got != "hello" {
			t.Fatalf("read %q", got)
		}
		fi, err := fa.Stat(ctx, id, "a/b/c.txt")
		if err != nil || fi.Size != 5 || fi.Mode.Perm() != 0o640 || fi.IsDir || fi.UID != 0 {
			t.Fatalf("stat %+v %v", fi, err)
		}
		if got := Sh(t, b, id, "cat /workspace/a/b/c.txt; stat -c %a a/b/c.txt"); got != "hello640\n" {
			t.Fatalf("seen from a command: %q", got)
		}
	})
	t.Run("Missing", func(t *testing.T) {
		_, err := fa.ReadFile(ctx, id, "nope.txt")
		WantErr(t, "read missing", err, errdefs.ErrNotFound)
		_, err = fa.Stat(ctx, id, "nope.txt")
		WantErr(t, "stat missing", err, errdefs.ErrNotFound)
	})
	t.Run("MkdirListRenameRemove", func(t *testing.T) {
		if err := fa.Mkdir(ctx, id, "tree/x/y", 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"tree/one.go", "tree/two.txt", "tree/x/three.go", "tree/x/y/four.go"} {
			if err := fa.WriteFile(ctx, id, f, 0, strings.NewReader(f)); err != nil {
				t.Fatal(err)
			}
		}
		names := func(fis []backend.FileInfo) string {
			var n []string
			for _, fi := range fis {
				n = append(n, strings.TrimPrefix(fi.Path, "/workspace/tree/"))
			}
			return strings.Join(n, ",")
		}
		l, err := fa.List(ctx, id, "tree", backend.ListOptions{})
		if err != nil || names(l) != "one.go,two.txt,x" {
			t.Fatalf("list depth 1: %q %v", names(l), err)
		}
		l, err = fa.List(ctx, id, "tree", backend.ListOptions{Depth: 3, Glob: "*.go"})
		if err != nil || names(l) != "one.go,x/three.go,x/y/four.go" {
			t.Fatalf("list depth 3 *.go: %q %v", names(l), err)
		}
		if err := fa.Rename(ctx, id, "tree/two.txt", "tree/x/2.txt"); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t)(fa.ReadFile(ctx, id, "tree/x/2.txt")); got != "tree/two.txt" {
			t.Fatalf("after rename %q", got)
		}
		WantErr(t, "remove a dir without recursive", fa.Remove(ctx, id, "tree", false), errdefs.ErrFailedPrecondition)
		if err := fa.Remove(ctx, id, "tree", true); err != nil {
			t.Fatal(err)
		}
		_, err = fa.Stat(ctx, id, "tree")
		WantErr(t, "stat removed", err, errdefs.ErrNotFound)
	})
	t.Run("LargeBinaryFile", func(t *testing.T) {
		data := make([]byte, 5<<20+123)
		for i := range data {
			data[i] = byte(i * 7)
		}
		if err := fa.WriteFile(ctx, id, "big.bin", 0o600, strings.NewReader(string(data))); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t)(fa.ReadFile(ctx, id, "big.bin")); got != string(data) {
			t.Fatalf("big file differs (%d bytes back)", len(got))
		}
	})
	t.Run("SymlinksStayInside", func(t *testing.T) {
		marker := h.HostMarker
		if marker == "" {
			t.Skip("harness gave no host marker")
		}
		Sh(t, b, id, "ln -sfn / /workspace/root-link; ln -sfn "+marker+" /workspace/marker-link; ln -sfn "+
			filepath.Dir(marker)+" /workspace/dir-link")
		if got := readAll(t)(fa.ReadFile(ctx, id, "root-link/etc/hostname")); strings.TrimSpace(got) != id {
			t.Fatalf("root-link/etc/hostname read %q: the sandbox's own, %q, was wanted", got, id)
		}
		_, err := fa.ReadFile(ctx, id, "marker-link")
		WantErr(t, "read through a symlink to a host file", err, errdefs.ErrNotFound)
		escape := filepath.Join(filepath.Dir(marker), "written-through-link")
		_ = fa.WriteFile(ctx, id, "dir-link/written-through-link", 0o644, strings.NewReader("x"))
		if _, err := os.Stat(escape); err == nil {
			t.Fatalf("a write through a symlink created %s on the host", escape)
		}
		_, err = fa.ReadFile(ctx, id, "../../../../../../.."+marker)
		WantErr(t, "read with .. beyond the root", err, errdefs.ErrNotFound)
	})
	t.Run("Archive", func(t *testing.T) { testArchive(t, b, id) })
	t.Run("BadPaths", func(t *testing.T) {
		_, err := fa.ReadFile(ctx, id, "a\x00b")
		WantErr(t, "NUL in path", err, errdefs.ErrInvalidArgument)
		_, err = fa.ReadFile(ctx, id, "/workspace")
		WantErr(t, "read a directory", err, errdefs.ErrFailedPrecondition)
		WantErr(t, "remove /", fa.Remove(ctx, id, "/", true), errdefs.ErrPermissionDenied)
	})
}

func testLimits(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	bystander := NewID("bystander")
	Create(t, b, backend.Spec{ID: bystander})
	t.Run("ForkBombHitsPidsMax", func(t *testing.T) {
		id := NewID("pids")
		Create(t, b, backend.Spec{ID: id, Limits: backend.Limits{Pids: 32}})
		// The bomb's shell dies when fork fails; the outer shell then
		// counts processes with builtins only, since it cannot fork either.
		r := Exec(t, b, id, backend.ExecRequest{Cmd: "sh -c 'for i in $(seq 1 100); do sleep 5 & done' 2>/dev/null; " +
			"echo started; set -- /proc/[0-9]*; echo $#", Timeout: 20 * time.Second})
		f := lines(r.Stdout)
		if len(f) < 2 || f[0] != "started" {
			t.Fatalf("fork bomb output %q %+v", r.Stdout, r.Exit)
		}
		if n := atoi(f[1]); n > 32 || n < 8 {
			t.Fatalf("%d processes alive under a limit of 32", n)
		}
		Sh(t, b, bystander, "true")
	})
	t.Run("MemoryHogIsOOMKilled", func(t *testing.T) {
		id := NewID("mem")
		Create(t, b, backend.Spec{ID: id, Limits: backend.Limits{MemoryBytes: 64 << 20}})
		r := Exec(t, b, id, backend.ExecRequest{Cmd: "exec dd if=/dev/zero of=/dev/null bs=256M count=1"})
		if r.Exit.Signal != "SIGKILL" {
			t.Fatalf("memory hog: %+v %q", r.Exit, r.Stderr)
		}
		if got := Sh(t, b, id, "echo alive"); got != "alive\n" {
			t.Fatalf("sandbox after OOM: %q", got)
		}
		Sh(t, b, bystander, "true")
	})
	_ = ctx
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

func testLifecycle(t *testing.T, h Harness, b backend.Backend) {
	ctx := context.Background()
	t.Run("StopStartKeepsFiles", func(t *testing.T) {
		id := NewID("life")
		Create(t, b, backend.Spec{ID: id})
		Sh(t, b, id, "echo kept > /workspace/k; mkdir -p /opt/x && echo also > /opt/x/y; sleep 100 & true")
		if err := b.Stop(ctx, id); err != nil {
			t.Fatal(err)
		}
		if info, err := b.Inspect(ctx, id); err != nil || info.Status != backend.StatusStopped {
			t.Fatalf("after stop: %+v %v", info, err)
		}
		_, err := b.Exec(ctx, id, backend.ExecRequest{Cmd: "true"})
		WantErr(t, "exec on a stopped sandbox", err, errdefs.ErrFailedPrecondition)
		if _, err := b.Start(ctx, id); err != nil {
			t.Fatal(err)
		}
		if got := Sh(t, b, id, "cat /workspace/k /opt/x/y; pgrep sleep || echo no-sleep"); got != "kept\nalso\nno-sleep\n" {
			t.Fatalf("after start: %q", got)
		}
	})
	t.Run("DestroyIsIdempotentAndClean", func(t *testing.T) {
		id := NewID("gone")
		if _, err := b.Create(ctx, backend.Spec{ID: id}); err != nil {
			t.Fatal(err)
		}
		Sh(t, b, id, "sleep 100 >/dev/null 2>&1 &")
		info, _ := b.Inspect(ctx, id)
		for i := 0; i < 2; i++ {
			if err := b.Destroy(ctx, id); err != nil {
				t.Fatalf("destroy #%d: %v", i+1, err)
			}
		}
		_, err := b.Inspect(ctx, id)
		WantErr(t, "inspect destroyed", err, errdefs.ErrNotFound)
		if h.Leaks != nil {
			if leaks := h.Leaks(t, b, id, info); len(leaks) > 0 {
				t.Fatalf("destroy left behind: %q", leaks)
			}
		}
	})
	t.Run("DestroyAfterInitDied", func(t *testing.T) {
		if h.KillInit == nil {
			t.Skip("harness cannot kill init")
		}
		id := NewID("crash")
		if _, err := b.Create(ctx, backend.Spec{ID: id}); err != nil {
			t.Fatal(err)
		}
		info, _ := b.Inspect(ctx, id)
		h.KillInit(t, b, info)
		deadline := time.Now().Add(5 * time.Second)
		for {
			info, _ = b.Inspect(ctx, id)
			if info.Status == backend.StatusDead || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if info.Status != backend.StatusDead {
			t.Fatalf("status after init died: %+v", info)
		}
		_, err := b.Exec(ctx, id, backend.ExecRequest{Cmd: "true"})
		WantErr(t, "exec on a dead sandbox", err, errdefs.ErrFailedPrecondition)
		if err := b.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		if h.Leaks != nil {
			if leaks := h.Leaks(t, b, id, info); len(leaks) > 0 {
				t.Fatalf("destroy left behind: %q", leaks)
			}
		}
	})
	t.Run("RecoverAfterRestart", func(t *testing.T) {
		if h.Reopen == nil {
			t.Skip("harness cannot reopen a backend")
		}
		id := NewID("recover")
		hd := Create(t, b, backend.Spec{ID: id})
		Sh(t, b, id, "echo before > /workspace/r; sleep 300 >/dev/null 2>&1 &")
		b2 := h.Reopen(t, b)
		info, err := b2.Recover(ctx, hd)
		if err != nil || info.Status != backend.StatusRunning {
			t.Fatalf("recover: %+v %v", info, err)
		}
		if got := Sh(t, b2, id, "cat /workspace/r; pgrep -c sleep"); got != "before\n1\n" {
			t.Fatalf("after recover: %q", got)
		}
		if err := b2.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("SuspendResume20Cycles", func(t *testing.T) { testSuspend(t, b) })
	t.Run("SuspendOverCapKeepsRunning", func(t *testing.T) { testSuspendOverCap(t, b) })
	t.Run("SnapshotAndFork", func(t *testing.T) { testSnapshot(t, h, b) })
	t.Run("PauseUnpause", func(t *testing.T) {
		pz, ok := b.(backend.Pauser)
		if !ok {
			t.Skip("backend has no Pauser capability")
		}
		id := NewID("pause")
		Create(t, b, backend.Spec{ID: id})
		if err := pz.Pause(ctx, id); err != nil {
			t.Fatal(err)
		}
		if info, _ := b.Inspect(ctx, id); info.Status != backend.StatusPaused {
			t.Fatalf("status %q, want paused", info.Status)
		}
		if err := pz.Unpause(ctx, id); err != nil {
			t.Fatal(err)
		}
		Sh(t, b, id, "true")
	})
}

func testBadInput(t *testing.T, h Harness, b backend.Backend) {
	ctx := context.Background()
	_, err := b.Create(ctx, backend.Spec{ID: "Bad/ID"})
	WantErr(t, "bad id", err, errdefs.ErrInvalidArgument)
	id := NewID("badbase")
	_, err = b.Create(ctx, backend.Spec{ID: id, Base: "dir:/no/such/rootfs"})
	WantErr(t, "missing base", err, errdefs.ErrNotFound)
	_, err = b.Inspect(ctx, id)
	WantErr(t, "inspect after failed create", err, errdefs.ErrNotFound)
	_, err = b.Create(ctx, backend.Spec{ID: id, Base: "floppy:/x"})
	WantErr(t, "unknown base kind", err, errdefs.ErrInvalidArgument)
	_, err = b.Create(ctx, backend.Spec{ID: id, Limits: backend.Limits{MemoryBytes: 1}})
	WantErr(t, "tiny memory limit", err, errdefs.ErrInvalidArgument)
	dup := NewID("dup")
	Create(t, b, backend.Spec{ID: dup})
	_, err = b.Create(ctx, backend.Spec{ID: dup})
	WantErr(t, "duplicate id", err, errdefs.ErrAlreadyExists)
	Sh(t, b, dup, "true") // the first is untouched
	_, err = b.Exec(ctx, "no-such-sandbox", backend.ExecRequest{Cmd: "true"})
	WantErr(t, "exec on a missing sandbox", err, errdefs.ErrNotFound)
	_, err = b.Exec(ctx, dup, backend.ExecRequest{Cmd: ""})
	WantErr(t, "empty command", err, errdefs.ErrInvalidArgument)
	_, err = ExecErr(b, dup, backend.ExecRequest{Cmd: "true", Cwd: "/no/such/dir"})
	WantErr(t, "missing cwd", err, errdefs.ErrNotFound)
	if err := b.Destroy(ctx, "never-existed"); err != nil {
		t.Fatalf("destroy of a missing sandbox: %v", err)
	}
	_ = fs.ModePerm
}

func testBase(t *testing.T, b backend.Backend, base string) {
	id := NewID("base")
	Create(t, b, backend.Spec{ID: id, Base: base})
	out := Sh(t, b, id, "echo hi > /workspace/f && cat /workspace/f && id -u && stat -c %u /etc/passwd && cat /proc/sys/kernel/hostname")
	if got := lines(out); len(got) != 4 || got[0] != "hi" || got[1] != "0" || got[2] != "0" || got[3] != id {
		t.Fatalf("on base %s: %q", base, out)
	}
}

func testArchive(t *testing.T, b backend.Backend, id string) {
	ar, ok := b.(backend.Archiver)
	if !ok {
		t.Skip("backend has no Archiver capability")
	}
	ctx := context.Background()
	Sh(t, b, id, "mkdir -p /workspace/src/sub && echo one > /workspace/src/a && echo two > /workspace/src/sub/b && "+
		"chmod 750 /workspace/src/sub && ln -s a /workspace/src/link")
	rc, err := ar.ReadArchive(ctx, id, "src")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if err := ar.WriteArchive(ctx, id, "/tmp/dst", bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	got := Sh(t, b, id, "cd /tmp/dst && cat a sub/b && readlink link && stat -c %a sub")
	if got != "one\ntwo\na\n750\n" {
		t.Fatalf("round trip: %q", got)
	}
	// A hostile archive: an entry with .. and one through a planted symlink.
	for name, entries := range map[string][]tarEntry{
		"dotdot":  {{name: "../escaped", body: "x"}},
		"symlink": {{name: "out", link: "/"}, {name: "out/tmp/escaped-through-link", body: "x"}},
	} {
		err := ar.WriteArchive(ctx, id, "/workspace/unpack-"+name, bytes.NewReader(makeTar(t, entries)))
		WantErr(t, "hostile archive "+name, err, errdefs.ErrInvalidArgument)
	}
	if r := Exec(t, b, id, backend.ExecRequest{Cmd: "ls /workspace/escaped /tmp/escaped-through-link"}); r.Exit.Code == 0 {
		t.Fatalf("a hostile archive wrote outside its directory: %q", r.Stdout)
	}
	_, err = ar.ReadArchive(ctx, id, "src/a")
	WantErr(t, "archive of a file", err, errdefs.ErrFailedPrecondition)
}

type tarEntry struct{ name, body, link string }

func makeTar(t *testing.T, entries []tarEntry) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg}
		if e.link != "" {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeSymlink, e.link, 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return buf.Bytes()
}
