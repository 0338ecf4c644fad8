// Package crashtest kills a real `hutch serve` with SIGKILL at the worst
// moments (while an archive is written, while one is restored, while a
// sandbox is made) and checks what a new daemon on the same data directory
// finds: no corrupt archive, no lost or stuck sandbox, no temporary file.
package crashtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// bin is the hutch binary the tests run, built once by TestMain.
var bin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() == 0 {
		dir, err := os.MkdirTemp("", "hutch-crashtest-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		// The binary's directory must be traversable: inits re-exec it as
		// their sandbox's unprivileged root.
		if err := os.Chmod(dir, 0o711); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		bin = filepath.Join(dir, "hutch")
		cmd := exec.Command("go", "build", "-o", bin, "github.com/hutch-dev/hutch/cmd/hutch")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build hutch: %v\n%s", err, out)
			return 1
		}
	}
	return m.Run()
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("crash tests run a real daemon, which needs root (native backend)")
	}
}

// dataDir makes a data directory every uid can traverse; cleanup (see
// newRig) removes it.
func dataDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "hutch-crash-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

// daemon is one `hutch serve` process.
type daemon struct {
	t    *testing.T
	data string
	cmd  *exec.Cmd
	log  *syncBuffer
	hc   *http.Client
	done chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs a daemon on data and waits until it answers.
func start(t *testing.T, data string, log *syncBuffer, args ...string) *daemon {
	t.Helper()
	fmt.Fprintf(log, "=== start daemon %s\n", time.Now().Format("15:04:05.000"))
	cmd := exec.Command(bin, append([]string{"serve", "--data", data, "--log-level", "debug", "--grace", "2s"}, args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, data: data, cmd: cmd, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(d.done) }()
	sock := filepath.Join(data, "hutch.sock")
	d.hc = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-d.done:
			t.Fatalf("the daemon exited while starting:\n%s", log)
		default:
		}
		if st, _ := d.try("GET", "/v1/health", nil); st == 200 {
			return d
		}
		if time.Now().After(deadline) {
			d.kill()
			t.Fatalf("the daemon did not answer within 30s:\n%s", log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// kill ends the daemon with SIGKILL: no defer, no cleanup runs.
func (d *daemon) kill() {
	fmt.Fprintf(d.log, "=== kill -9 daemon %s\n", time.Now().Format("15:04:05.000"))
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
}

// stop shuts the daemon down gracefully (sandboxes keep running).
func (d *daemon) stop() {
	fmt.Fprintf(d.log, "=== stop daemon %s\n", time.Now().Format("15:04:05.000"))
	_ = d.cmd.Process.Signal(os.Interrupt)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		d.t.Errorf("the daemon did not stop within 20s after SIGINT")
		d.kill()
	}
}

func (d *daemon) try(method, path string, body any) (int, []byte) {
	var r io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			d.t.Fatal(err)
		}
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, "http://hutch"+path, r)
	if err != nil {
		d.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := d.hc.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// call does a request that must answer want, decoding the answer into out.
func (d *daemon) call(method, path string, body any, want int, out any) {
	d.t.Helper()
	st, raw := d.try(method, path, body)
	if st != want {
		d.t.Fatalf("%s %s: %d %s (want %d)", method, path, st, raw, want)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			d.t.Fatalf("%s %s: %v: %s", method, path, err, raw)
		}
	}
}

// sandbox is the part of the API's Sandbox the tests read.
type sandbox struct {
	ID      string `json:"id"`
	State   string `json:"state"`
	Reason  string `json:"reason"`
	Archive *struct {
		Size   int64  `json:"size"`
		SHA256 string `json:"sha256"`
	} `json:"archive"`
}

func (d *daemon) create(id string) sandbox {
	d.t.Helper()
	var sb sandbox
	d.call("POST", "/v1/sandboxes", map[string]any{"id": id, "idle_timeout": -1}, 201, &sb)
	return sb
}

func (d *daemon) get(id string) (sandbox, int) {
	d.t.Helper()
	st, raw := d.try("GET", "/v1/sandboxes/"+id, nil)
	var sb sandbox
	if st == 200 {
		if err := json.Unmarshal(raw, &sb); err != nil {
			d.t.Fatal(err)
		}
	}
	return sb, st
}

func (d *daemon) list() []sandbox {
	d.t.Helper()
	var l struct {
		Sandboxes []sandbox `json:"sandboxes"`
	}
	d.call("GET", "/v1/sandboxes?limit=1000", nil, 200, &l)
	return l.Sandboxes
}

// sh runs cmd in a sandbox (within 30s) and returns its stdout; it must
// exit 0.
func (d *daemon) sh(id, cmd string) string {
	d.t.Helper()
	var res struct {
		ExitCode *int   `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
		TimedOut bool   `json:"timed_out"`
	}
	d.call("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": cmd, "timeout": 30}, 200, &res)
	if res.ExitCode == nil || *res.ExitCode != 0 {
		d.t.Fatalf("%s: %q: exit %v (timed out %v), stderr %q", id, cmd, res.ExitCode, res.TimedOut, res.Stderr)
	}
	return res.Stdout
}

// async starts a request the daemon may never answer (it is killed).
func (d *daemon) async(method, path string) <-chan string {
	c := make(chan string, 1)
	go func() {
		st, raw := d.try(method, path, nil)
		c <- fmt.Sprintf("%d %s", st, raw)
	}()
	return c
}

// waitFor polls cond every 200µs until it holds, failing after limit.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// fileSize is the size of path, or -1.
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return -1
	}
	return fi.Size()
}

// tempArchives lists blob.Dir's temporary files in data's archive store.
func tempArchives(data string) []string {
	m, _ := filepath.Glob(filepath.Join(data, "archives", ".put-*"))
	return m
}

// cgroupTag is the native backend's tag for data's cgroups ("h" + the
// first 4 bytes of the sha256 of its path).
func cgroupTag(data string) string {
	sum := sha256.Sum256([]byte(data))
	return "h" + hex.EncodeToString(sum[:4])
}

// leftCgroups lists the cgroup directories data's sandboxes left, in every
// hierarchy the backend uses (it nests them under its own cgroup, which
// the daemon inherited from this test).
func leftCgroups(data string) []string {
	raw, _ := os.ReadFile("/proc/self/cgroup")
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var roots []string
		switch parts[1] {
		case "memory", "pids", "freezer":
			roots = []string{"/sys/fs/cgroup/" + parts[1]}
		case "cpu", "cpu,cpuacct":
			roots = []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}
		case "":
			roots = []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}
		}
		for _, r := range roots {
			m, _ := filepath.Glob(filepath.Join(r, parts[2], "hutch", cgroupTag(data)+"-s*"))
			out = append(out, m...)
		}
	}
	return out
}

// inits lists the live processes running bin (sandbox inits; the daemon
// too while it runs).
func inits() []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink("/proc/" + e.Name() + "/exe")
		if err != nil || strings.TrimSuffix(exe, " (deleted)") != bin {
			continue
		}
		if stat, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && strings.Contains(string(stat), ") Z ") {
			continue
		}
		out = append(out, pid)
	}
	return out
}
