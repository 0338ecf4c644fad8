package backendtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

func testIsolation(t *testing.T, h Harness, b backend.Backend) {
	os.Setenv("HUTCH_TEST_HOST_CANARY", "leaked")
	defer os.Unsetenv("HUTCH_TEST_HOST_CANARY")
	// A host directory fd open without close-on-exec while the sandbox is
	// made: the shape of runc's CVE-2024-21626. It must not reach inside.
	rootFd, err := syscall.Open("/", syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	const hostRootFd = 99 // above anything a launcher renumbers
	if err := syscall.Dup3(rootFd, hostRootFd, 0); err != nil {
		t.Fatal(err)
	}
	syscall.Close(rootFd)
	id := NewID("iso")
	Create(t, b, backend.Spec{ID: id, Hostname: "box-" + id[len(id)-3:]})
	syscall.Close(hostRootFd)
	t.Run("RootIsMappedNotIdentity", func(t *testing.T) {
		f := lines(Sh(t, b, id, "cat /proc/self/uid_map; id -u"))
		if len(f) < 4 || f[0] != "0" || f[1] == "0" || f[3] != "0" {
			t.Fatalf("uid_map/id: %q: want root inside mapped to a non-zero host uid", f)
		}
	})
	t.Run("BaseFilesLookRootOwned", func(t *testing.T) {
		if got := strings.TrimSpace(Sh(t, b, id, "stat -c %u:%g /usr/bin/env /etc/passwd")); got != "0:0\n0:0" && got != "0:0\r\n0:0" {
			if lines(got)[0] != "0:0" || lines(got)[1] != "0:0" {
				t.Fatalf("owners %q, want 0:0", got)
			}
		}
	})
	t.Run("OnlyLoopback", func(t *testing.T) {
		out := Sh(t, b, id, "tail -n +3 /proc/net/dev | cut -d: -f1")
		if got := lines(out); len(got) != 1 || got[0] != "lo" {
			t.Fatalf("interfaces %q, want only lo", got)
		}
	})
	t.Run("Hostname", func(t *testing.T) {
		if got := strings.TrimSpace(Sh(t, b, id, "cat /proc/sys/kernel/hostname")); got != "box-"+id[len(id)-3:] {
			t.Fatalf("hostname %q", got)
		}
	})
	t.Run("ProcShowsOnlySandbox", func(t *testing.T) {
		out := Sh(t, b, id, "ls /proc | grep -c '^[0-9][0-9]*$'; cat /proc/1/comm 2>/dev/null || echo unreadable")
		f := lines(out)
		n, _ := strconv.Atoi(f[0])
		if n == 0 || n > 6 {
			t.Fatalf("sandbox sees %d processes, want a handful (init, sh, ls)", n)
		}
	})
	t.Run("HostPathsAbsent", func(t *testing.T) {
		cwd, _ := os.Getwd()
		paths := []string{cwd, "/root/.bash_history", "/var/lib", "/run/docker.sock"}
		if h.HostMarker != "" {
			paths = append(paths, h.HostMarker)
		}
		for _, p := range paths {
			r := Exec(t, b, id, backend.ExecRequest{Cmd: "test -e " + p + " && ls -la " + p})
			if r.Exit.Code == 0 && p != "/var/lib" {
				t.Errorf("host path %s is visible: %q", p, r.Stdout)
			}
		}
		if out := Sh(t, b, id, "ls -A /var/lib | wc -l"); strings.TrimSpace(out) != "0" {
			hostVarLib, _ := os.ReadDir("/var/lib")
			if len(hostVarLib) > 0 && strings.TrimSpace(out) == strconv.Itoa(len(hostVarLib)) {
				t.Errorf("/var/lib looks like the host's")
			}
		}
	})
	t.Run("NoHostEnvFdOrCwd", func(t *testing.T) {
		out := Sh(t, b, id, "env; echo CWD=$(pwd)")
		if strings.Contains(out, "HUTCH_TEST_HOST_CANARY") {
			t.Errorf("host environment leaked: %q", out)
		}
		if !strings.Contains(out, "CWD=/workspace") {
			t.Errorf("default cwd is not /workspace: %q", out)
		}
		// ls's only descriptor of its own is the directory it lists, which
		// takes the lowest free number: 3. Anything else was inherited.
		for _, fd := range lines(Sh(t, b, id, "exec ls /proc/self/fd")) {
			if n := atoi(fd); n < 0 || n > 3 {
				t.Errorf("fd %s is open in a fresh command; want only 0-2", fd)
			}
		}
	})
	t.Run("ConfinedSyscalls", func(t *testing.T) {
		r := Exec(t, b, id, backend.ExecRequest{Cmd: "grep -E '^(NoNewPrivs|Seccomp|CapBnd):' /proc/self/status"})
		if !strings.Contains(r.Stdout, "NoNewPrivs:\t1") || !strings.Contains(r.Stdout, "Seccomp:\t2") {
			t.Errorf("command is not confined: %q", r.Stdout)
		}
		for _, cmd := range []string{"unshare -U true", "unshare -m true", "mount -t tmpfs x /mnt"} {
			if r := Exec(t, b, id, backend.ExecRequest{Cmd: cmd + " 2>&1"}); r.Exit.Code == 0 {
				t.Errorf("%q succeeded inside the sandbox", cmd)
			}
		}
	})
	t.Run("OtherSandboxUnseen", func(t *testing.T) {
		other := NewID("iso2")
		Create(t, b, backend.Spec{ID: other})
		Sh(t, b, id, "echo mine > /workspace/only-in-one; sleep 30 >/dev/null 2>&1 & echo started")
		if r := Exec(t, b, other, backend.ExecRequest{Cmd: "test -e /workspace/only-in-one"}); r.Exit.Code == 0 {
			t.Errorf("a file of one sandbox is visible in another")
		}
		if out := Sh(t, b, other, "cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '"); strings.Contains(out, "sleep 30") {
			t.Errorf("a process of one sandbox is visible in another: %q", out)
		}
	})
}

func testExec(t *testing.T, b backend.Backend) {
	id := NewID("exec")
	Create(t, b, backend.Spec{ID: id, Env: map[string]string{"FROM_SPEC": "spec"}})
	t.Run("StdoutStderrExitCode", func(t *testing.T) {
		r := Exec(t, b, id, backend.ExecRequest{Cmd: "echo out; echo err >&2; exit 7"})
		if r.Stdout != "out\n" || r.Stderr != "err\n" || r.Exit.Code != 7 {
			t.Fatalf("got %+v", r)
		}
	})
	t.Run("Stdin", func(t *testing.T) {
		p, err := b.Exec(context.Background(), id, backend.ExecRequest{Cmd: "tr a-z A-Z", Stdin: true})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		p.Write([]byte("hello "))
		p.Write([]byte("stdin\n"))
		p.CloseStdin()
		var out bytes.Buffer
		st, err := backend.Wait(p, &out, nil)
		if err != nil || st.Code != 0 || out.String() != "HELLO STDIN\n" {
			t.Fatalf("got %q %+v %v", out.String(), st, err)
		}
	})
	t.Run("EnvAndCwd", func(t *testing.T) {
		r := Exec(t, b, id, backend.ExecRequest{Cmd: "echo $FROM_SPEC $FROM_REQ $HOME; pwd", Cwd: "/tmp",
			Env: map[string]string{"FROM_REQ": "req"}})
		if r.Stdout != "spec req /root\n/tmp\n" {
			t.Fatalf("got %q", r.Stdout)
		}
		r = Exec(t, b, id, backend.ExecRequest{Cmd: "pwd", Cwd: "sub/dir/../.."})
		if r.Stdout != "/workspace\n" {
			t.Fatalf("relative cwd: %q", r.Stdout)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		start := time.Now()
		r := Exec(t, b, id, backend.ExecRequest{Cmd: "echo before; sleep 30", Timeout: 300 * time.Millisecond})
		if !r.Exit.TimedOut || r.Exit.Code != -1 || r.Stdout != "before\n" {
			t.Fatalf("got %+v", r)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("timeout took %v", d)
		}
	})
	t.Run("Signal", func(t *testing.T) {
		p, err := b.Exec(context.Background(), id, backend.ExecRequest{Cmd: "echo ready; exec sleep 30"})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if ev, err := p.Recv(); err != nil || string(ev.Data) != "ready\n" {
			t.Fatalf("first event %+v %v", ev, err)
		}
		if err := p.Signal(context.Background(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		st, err := backend.Wait(p, nil, nil)
		if err != nil || st.Signal != "SIGTERM" || st.Code != -1 || st.TimedOut || st.Killed {
			t.Fatalf("got %+v %v", st, err)
		}
	})
	t.Run("LargeOutput", func(t *testing.T) {
		const n = 20 << 20
		p, err := b.Exec(context.Background(), id, backend.ExecRequest{Cmd: "head -c " + strconv.Itoa(n) + " /dev/zero; echo done >&2"})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		var cnt countWriter
		var errb bytes.Buffer
		st, err := backend.Wait(p, &cnt, &errb)
		if err != nil || st.Code != 0 || cnt.n != n || errb.String() != "done\n" {
			t.Fatalf("got %d bytes, stderr %q, %+v %v", cnt.n, errb.String(), st, err)
		}
	})
	t.Run("BinaryOutput", func(t *testing.T) {
		data := make([]byte, 64<<10)
		rand.Read(data)
		p, err := b.Exec(context.Background(), id, backend.ExecRequest{Cmd: "cat", Stdin: true})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		go func() { p.Write(data); p.CloseStdin() }()
		var out bytes.Buffer
		if st, err := backend.Wait(p, &out, nil); err != nil || st.Code != 0 || !bytes.Equal(out.Bytes(), data) {
			t.Fatalf("binary round trip: %d bytes back, equal=%v, %+v %v", out.Len(), bytes.Equal(out.Bytes(), data), st, err)
		}
	})
	t.Run("AbortKillsForeground", func(t *testing.T) {
		p, err := b.Exec(context.Background(), id, backend.ExecRequest{Cmd: "echo go; sleep 1; touch /tmp/after-abort"})
		if err != nil {
			t.Fatal(err)
		}
		p.Recv()
		p.Close()
		time.Sleep(1500 * time.Millisecond)
		if r := Exec(t, b, id, backend.ExecRequest{Cmd: "test -e /tmp/after-abort"}); r.Exit.Code == 0 {
			t.Fatal("the aborted command ran on")
		}
	})
	t.Run("ZombiesReaped", func(t *testing.T) {
		Sh(t, b, id, "for i in 1 2 3 4 5; do (sleep 0.05 &) ; done; sleep 0.3")
		time.Sleep(200 * time.Millisecond)
		if out := Sh(t, b, id, "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l"); strings.TrimSpace(out) != "0" {
			t.Fatalf("%s zombies left", strings.TrimSpace(out))
		}
	})
}

type countWriter struct{ n int }

func (c *countWriter) Write(p []byte) (int, error) { c.n += len(p); return len(p), nil }

func testTTY(t *testing.T, b backend.Backend) {
	if !b.Capabilities().PTY {
		t.Skip("backend has no PTY capability")
	}
	id := NewID("tty")
	Create(t, b, backend.Spec{ID: id})
	r := Exec(t, b, id, backend.ExecRequest{Cmd: "tty; stty size; echo $TERM", TTY: true, Rows: 30, Cols: 100})
	out := strings.ReplaceAll(r.Stdout, "\r", "")
	if !strings.HasPrefix(out, "/dev/pts/") || !strings.Contains(out, "30 100\n") || !strings.Contains(out, "xterm") {
		t.Fatalf("tty output %q", out)
	}
	p, err := b.Exec(context.Background(), id, backend.ExecRequest{Cmd: "read line; stty size; echo got:$line", TTY: true, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Resize(context.Background(), 50, 132); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	p.Write([]byte("typed\n"))
	var buf bytes.Buffer
	st, err := backend.Wait(p, &buf, nil)
	out = strings.ReplaceAll(buf.String(), "\r", "")
	if err != nil || st.Code != 0 || !strings.Contains(out, "50 132\n") || !strings.Contains(out, "got:typed") {
		t.Fatalf("interactive tty: %q %+v %v", out, st, err)
	}
}

func testProcesses(t *testing.T, b backend.Backend) {
	at, ok := b.(backend.ProcessController)
	if !ok {
		t.Skip("backend has no ProcessController capability")
	}
	id := NewID("proc")
	Create(t, b, backend.Spec{ID: id})
	ctx := context.Background()
	p, err := b.Exec(ctx, id, backend.ExecRequest{Cmd: "for i in 1 2 3 4 5 6; do echo line$i; sleep 0.05; done",
		Background: true, Tag: "counter"})
	if err != nil {
		t.Fatal(err)
	}
	procID := p.ID()
	p.Close() // detach: a background process keeps running
	time.Sleep(600 * time.Millisecond)
	ps, err := at.Processes(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var found *backend.ProcessInfo
	for i := range ps {
		if ps[i].ID == procID {
			found = &ps[i]
		}
	}
	if found == nil || found.Tag != "counter" || found.Exit == nil || found.Exit.Code != 0 {
		t.Fatalf("process table %+v lacks the finished background process", ps)
	}
	all := attachAll(t, at, id, procID, 0)
	if strings.Join(all.lines, "") != "line1\nline2\nline3\nline4\nline5\nline6\n" || all.exit == nil {
		t.Fatalf("re-attach from 0: %q exit %+v", all.lines, all.exit)
	}
	from := all.seqs[3]
	tail := attachAll(t, at, id, procID, from)
	if len(tail.seqs) == 0 || tail.seqs[0] != from || strings.Join(tail.lines, "") != strings.Join(all.lines[3:], "") {
		t.Fatalf("re-attach from seq %d: %q (seqs %v)", from, tail.lines, tail.seqs)
	}
	if _, err := at.Attach(ctx, id, "no-such-proc", 0); !errorsIs(err, errdefs.ErrNotFound) {
		t.Fatalf("attach to a missing process: %v", err)
	}
	// A live follow sees output as it comes.
	live, err := b.Exec(ctx, id, backend.ExecRequest{Cmd: "echo a; sleep 0.3; echo b", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	live.Close()
	got := attachAll(t, at, id, live.ID(), 0)
	if strings.Join(got.lines, "") != "a\nb\n" {
		t.Fatalf("live follow: %q", got.lines)
	}
	// Stdin and signals reach a detached background process.
	bg, err := b.Exec(ctx, id, backend.ExecRequest{Cmd: "read a; echo got:$a; sleep 30", Background: true, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	bg.Close()
	if err := at.WriteStdin(ctx, id, bg.ID(), strings.NewReader("hello\n"), true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := at.SignalProcess(ctx, id, bg.ID(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := attachAll(t, at, id, bg.ID(), 0)
	if strings.Join(done.lines, "") != "got:hello\n" || done.exit == nil || done.exit.Signal != "SIGTERM" {
		t.Fatalf("background stdin+signal: %q %+v", done.lines, done.exit)
	}
	pi, err := at.ProcessInfo(ctx, id, bg.ID())
	if err != nil || pi.Exit == nil || pi.Exit.Signal != "SIGTERM" {
		t.Fatalf("process info: %+v %v", pi, err)
	}
	_, err = at.ProcessInfo(ctx, id, "nope")
	WantErr(t, "info of a missing process", err, errdefs.ErrNotFound)
	WantErr(t, "stdin of a finished process", at.WriteStdin(ctx, id, bg.ID(), strings.NewReader("x"), false), errdefs.ErrFailedPrecondition)
}

type attached struct {
	lines []string
	seqs  []uint64
	exit  *backend.ExitStatus
}

func attachAll(t *testing.T, at backend.ProcessController, id, procID string, from uint64) attached {
	t.Helper()
	p, err := at.Attach(context.Background(), id, procID, from)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var a attached
	for {
		ev, err := p.Recv()
		if err == io.EOF {
			return a
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Exit != nil {
			a.exit = ev.Exit
			continue
		}
		a.lines = append(a.lines, string(ev.Data))
		a.seqs = append(a.seqs, ev.Seq)
	}
}
