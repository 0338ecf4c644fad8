package native_test

import (
	"context"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/backend/backendtest"
	"github.com/hutch-dev/hutch/internal/backend/native"
)

// measure runs fn b.N times and reports the p50 and p95 of one run in ms,
// the figures docs/BENCHMARKS.md compares against the peers.
func measure(b *testing.B, fn func()) {
	b.Helper()
	measureSpan(b, func() time.Duration {
		t0 := time.Now()
		fn()
		return time.Since(t0)
	})
}

// measureSpan is measure for a fn that times its own span, leaving its
// set-up and tear-down out.
func measureSpan(b *testing.B, fn func() time.Duration) {
	b.Helper()
	d := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		d = append(d, fn())
	}
	b.StopTimer()
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	pct := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.95), "p95-ms")
	b.ReportMetric(float64(d[0].Microseconds())/1000, "min-ms")
}

// BenchmarkColdCreateFirstExec: a new sandbox on the host base, from
// Create to the end of its first command (`true`), with the warm pool of
// parked inits full, as it is when sandboxes are made at an agent's pace.
// Destroy and the pool's refill are not timed.
func BenchmarkColdCreateFirstExec(b *testing.B) {
	requireRoot(b)
	benchCreate(b, newBackend(b, traversableTempDir(b)))
}

// BenchmarkColdCreateFirstExecNoPool: the same with no parked inits: every
// create execs, namespaces and attaches a fresh init.
func BenchmarkColdCreateFirstExecNoPool(b *testing.B) {
	requireRoot(b)
	benchCreate(b, newBackendOpts(b, native.Options{DataDir: traversableTempDir(b), WarmInits: -1}))
}

func benchCreate(b *testing.B, bk *native.Backend) {
	ctx := context.Background()
	warm := func() {
		for bk.WarmReady() < bk.WarmSize() {
			time.Sleep(time.Millisecond)
		}
	}
	warm()
	measureSpan(b, func() time.Duration {
		id := backendtest.NewID("bench")
		t0 := time.Now()
		if _, err := bk.Create(ctx, backend.Spec{ID: id}); err != nil {
			b.Fatal(err)
		}
		mustRun(b, bk, id, "true")
		d := time.Since(t0)
		b.StopTimer()
		_ = bk.Destroy(ctx, id)
		warm()
		b.StartTimer()
		return d
	})
}

// BenchmarkExecRoundTrip: `true` in a live sandbox, request to exit event.
func BenchmarkExecRoundTrip(b *testing.B) {
	requireRoot(b)
	bk := newBackend(b, traversableTempDir(b))
	id := backendtest.NewID("rt")
	ctx := context.Background()
	if _, err := bk.Create(ctx, backend.Spec{ID: id}); err != nil {
		b.Fatal(err)
	}
	defer bk.Destroy(ctx, id)
	measure(b, func() { mustRun(b, bk, id, "true") })
}

func mustRun(b *testing.B, bk backend.Backend, id, cmd string) {
	p, err := bk.Exec(context.Background(), id, backend.ExecRequest{Cmd: cmd})
	if err != nil {
		b.Fatal(err)
	}
	st, err := backend.Wait(p, nil, nil)
	p.Close()
	if err != nil || st.Code != 0 {
		b.Fatalf("%s: %+v %v", cmd, st, err)
	}
}

// The peers, measured in the same run.

func BenchmarkPeerForkExecTrue(b *testing.B) {
	measure(b, func() { runPeer(b, "/bin/true") })
}

func BenchmarkPeerUnshareTrue(b *testing.B) {
	requireRoot(b)
	measure(b, func() { runPeer(b, "unshare", "-m", "-p", "-f", "-n", "-u", "-i", "/bin/true") })
}

func BenchmarkPeerBwrapTrue(b *testing.B) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		b.Skip("bwrap is not installed (apt-get install bubblewrap)")
	}
	measure(b, func() {
		runPeer(b, "bwrap", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
			"--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc",
			"--dev", "/dev", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "/bin/true")
	})
}

func runPeer(b *testing.B, name string, args ...string) {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		b.Fatalf("%s: %v: %s", name, err, out)
	}
}
