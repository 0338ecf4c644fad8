package native_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/backend/backendtest"
	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/blob"
)

// The lifecycle benchmarks (issue 4): pause/unpause, suspend/resume through
// the blob store as the manager does it, a warm-pool claim, and fork. See
// docs/BENCHMARKS.md for the figures and how to rerun them.

// report adds the p50, p95 and min of d (in ms) under prefix, as measure
// does for a single span.
func report(b *testing.B, prefix string, d []time.Duration) {
	b.Helper()
	if len(d) == 0 {
		return
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	pct := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), prefix+"p50-ms")
	b.ReportMetric(pct(0.95), prefix+"p95-ms")
	b.ReportMetric(float64(d[0].Microseconds())/1000, prefix+"min-ms")
}

// benchSandbox makes a running sandbox for a benchmark and destroys it at
// the end.
func benchSandbox(b *testing.B, bk *native.Backend, prefix string) string {
	b.Helper()
	id := backendtest.NewID(prefix)
	if _, err := bk.Create(context.Background(), backend.Spec{ID: id}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = bk.Destroy(context.Background(), id) })
	return id
}

// shB runs cmd in a sandbox and fails unless it exits 0.
func shB(b *testing.B, bk backend.Backend, id, cmd string) string {
	b.Helper()
	r, err := backendtest.ExecErr(bk, id, backend.ExecRequest{Cmd: cmd})
	if err != nil || r.Exit.Code != 0 {
		b.Fatalf("%q: %+v %v %s", cmd, r.Exit, err, r.Stderr)
	}
	return r.Stdout
}

// BenchmarkPause and BenchmarkUnpause: freeze and thaw every process of a
// running sandbox (cgroup freezer), one with a sleeping process in it
// (idle) and one with a busy loop too (busy), which competes with the
// benchmark for the CPUs once thawed.
func BenchmarkPause(b *testing.B) {
	b.Run("idle", func(b *testing.B) { benchPause(b, false, "sleep 1000") })
	b.Run("busy", func(b *testing.B) { benchPause(b, false, "sleep 1000 & while :; do :; done") })
}

func BenchmarkUnpause(b *testing.B) {
	b.Run("idle", func(b *testing.B) { benchPause(b, true, "sleep 1000") })
	b.Run("busy", func(b *testing.B) { benchPause(b, true, "sleep 1000 & while :; do :; done") })
}

func benchPause(b *testing.B, unpause bool, load string) {
	requireRoot(b)
	bk := newBackendOpts(b, native.Options{DataDir: traversableTempDir(b), WarmInits: -1})
	id := benchSandbox(b, bk, "pause")
	p, err := bk.Exec(context.Background(), id, backend.ExecRequest{Cmd: load, Background: true})
	if err != nil {
		b.Fatal(err)
	}
	p.Close()
	ctx := context.Background()
	measureSpan(b, func() time.Duration {
		t0 := time.Now()
		if err := bk.Pause(ctx, id); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := bk.Unpause(ctx, id); err != nil {
			b.Fatal(err)
		}
		if unpause {
			return time.Since(t1)
		}
		return t1.Sub(t0)
	})
	mustRun(b, bk, id, "true") // thawed for real
}

// The payloads written into /workspace before a suspend.
var payloads = map[string]string{
	// incompressible: zstd stores it nearly as is
	"random": "head -c %d /dev/urandom > /workspace/blob",
	// compressible like real trees (binaries, libraries, text): the first
	// N bytes of the host's /usr files, concatenated (this host has 4.6 GiB)
	"usr": "(find /usr/lib /usr/bin /usr/share -type f -size +4k -print0 | xargs -0 cat) 2>/dev/null | " +
		"head -c %[1]d > /workspace/blob; test $(stat -c %%s /workspace/blob) -eq %[1]d",
	// source code (C headers, Go and Python sources of the host's /usr),
	// concatenated and repeated: the best case for compression
	"source": "for i in 1 2 3 4 5 6 7 8; do find /usr/include /usr/local/go/src /usr/lib/python3* -type f " +
		"\\( -name '*.h' -o -name '*.go' -o -name '*.py' \\) -print0 | xargs -0 cat; done 2>/dev/null | " +
		"head -c %[1]d > /workspace/blob; test $(stat -c %%s /workspace/blob) -eq %[1]d",
}

// sizes of the suspend, resume and fork benchmarks, with an iteration cap
// for the slow ones (a 1000 MiB suspend and resume takes seconds).
var sizes = []struct {
	mib, maxN int
}{{10, 1 << 30}, {100, 40}, {1000, 6}}

// BenchmarkSuspendResume: suspend (freeze, pack the upper as tar + zstd,
// store it in a blob.Dir as the manager does: temp file, sha256, fsync,
// read-back verification, rename; then kill init and empty the upper) and
// resume (read the blob through its checking reader, unpack, start a new
// init), for 10, 100 and 1000 MiB of random data, of the host's /usr
// files (binaries and libraries: little to gain) and of source code (text).
// The 100 MiB cases run at most 40 times, the 1000 MiB ones 6 times.
func BenchmarkSuspendResume(b *testing.B) {
	requireRoot(b)
	for _, kind := range []string{"random", "usr", "source"} {
		for _, sz := range sizes {
			b.Run(fmt.Sprintf("%s-%dMiB", kind, sz.mib), func(b *testing.B) {
				benchSuspendResume(b, kind, sz.mib, sz.maxN)
			})
		}
	}
}

func benchSuspendResume(b *testing.B, kind string, mib, maxN int) {
	dir := traversableTempDir(b)
	bk := newBackendOpts(b, native.Options{DataDir: dir, WarmInits: -1})
	blobs, err := blob.NewDir(filepath.Join(dir, "archives"))
	if err != nil {
		b.Fatal(err)
	}
	id := benchSandbox(b, bk, "susp")
	shB(b, bk, id, fmt.Sprintf(payloads[kind], mib<<20))
	want := shB(b, bk, id, "md5sum /workspace/blob")
	ctx := context.Background()
	key := id + ".tar.zst"
	n := min(b.N, maxN)
	var sus, res []time.Duration
	var info blob.Info
	var stats backend.ArchiveStats
	b.ResetTimer()
	for range n {
		b.StopTimer()
		dropCaches(b, false)
		b.StartTimer()
		t0 := time.Now()
		stats, err = bk.Suspend(ctx, id, func(r io.Reader) error {
			var err error
			info, err = blobs.Put(ctx, key, r, 0)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		sus = append(sus, time.Since(t0))
		b.StopTimer()
		dropCaches(b, false)
		b.StartTimer()
		t0 = time.Now()
		r, _, err := blobs.Open(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := bk.Resume(ctx, id, r); err != nil {
			b.Fatal(err)
		}
		r.Close()
		mustRun(b, bk, id, "true")
		res = append(res, time.Since(t0))
	}
	b.StopTimer()
	if got := shB(b, bk, id, "md5sum /workspace/blob"); got != want {
		b.Fatalf("after %d cycles: %q, want %q", n, got, want)
	}
	report(b, "suspend-", sus)
	report(b, "resume-", res)
	b.ReportMetric(float64(info.Size)/float64(stats.Bytes), "ratio")
	b.ReportMetric(float64(n), "n")
}

// dropCaches writes dirty pages back (and, when all, drops the clean ones)
// so one iteration's writeback does not land in the next one's timing.
func dropCaches(b *testing.B, all bool) {
	b.Helper()
	if err := syncAll(); err != nil {
		b.Fatal(err)
	}
	if all {
		_ = os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
	}
}

func syncAll() error {
	f, err := os.Open("/")
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync() // syncfs would be narrower; the benchmark owns the disk
}

// BenchmarkClaimFirstExec: create → first exec done with a full pool of 8
// parked inits (the pool is refilled between iterations, untimed): the
// latency of one claim.
func BenchmarkClaimFirstExec(b *testing.B) {
	requireRoot(b)
	benchCreate(b, newBackendOpts(b, native.Options{DataDir: traversableTempDir(b), WarmInits: 8}))
}

// BenchmarkClaimThroughput: sandboxes made back to back (create → first
// exec, by one client and by 4 at once), starting from a full pool of 8.
// It reports the rate of the first 8 (served from the pool: the burst) and
// of the rest (the pool is empty, so every create waits for the refiller or
// starts an init itself: the sustained rate). Destroys run after, untimed.
func BenchmarkClaimThroughput(b *testing.B) {
	requireRoot(b)
	for _, clients := range []int{1, 4} {
		b.Run("clients="+strconv.Itoa(clients), func(b *testing.B) {
			benchThroughput(b, clients)
		})
	}
}

func benchThroughput(b *testing.B, clients int) {
	const pool, total = 8, 48
	bk := newBackendOpts(b, native.Options{DataDir: traversableTempDir(b), WarmInits: pool})
	ctx := context.Background()
	var burst, sustained []float64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		for bk.WarmReady() < bk.WarmSize() {
			time.Sleep(time.Millisecond)
		}
		b.StartTimer()
		var (
			mu    sync.Mutex
			done  []time.Time
			ids   []string
			wg    sync.WaitGroup
			next  = make(chan int, total)
			start = time.Now()
		)
		for i := range total {
			next <- i
		}
		close(next)
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range next {
					id := backendtest.NewID("tp")
					if _, err := bk.Create(ctx, backend.Spec{ID: id}); err != nil {
						b.Error(err)
						return
					}
					mustRun(b, bk, id, "true")
					mu.Lock()
					done = append(done, time.Now())
					ids = append(ids, id)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		sort.Slice(done, func(i, j int) bool { return done[i].Before(done[j]) })
		if len(done) == total {
			burst = append(burst, float64(pool)/done[pool-1].Sub(start).Seconds())
			sustained = append(sustained, float64(total-pool)/done[total-1].Sub(done[pool-1]).Seconds())
		}
		for _, id := range ids {
			_ = bk.Destroy(ctx, id)
		}
		b.StartTimer()
	}
	b.StopTimer()
	sort.Float64s(burst)
	sort.Float64s(sustained)
	if len(burst) > 0 {
		b.ReportMetric(burst[len(burst)/2], "burst-claims/s")
		b.ReportMetric(sustained[len(sustained)/2], "sustained-claims/s")
	}
}

// BenchmarkParkRate: how fast the refiller alone can park inits, the bound
// on the sustained claim rate. Measured from an empty pool of 8 until full.
func BenchmarkParkRate(b *testing.B) {
	requireRoot(b)
	var rates []float64
	for range b.N {
		b.StopTimer()
		dir := traversableTempDir(b)
		b.StartTimer()
		t0 := time.Now()
		bk, err := native.New(native.Options{DataDir: dir, WarmInits: 8})
		if err != nil {
			b.Fatal(err)
		}
		for bk.WarmReady() < bk.WarmSize() {
			time.Sleep(200 * time.Microsecond)
		}
		rates = append(rates, 8/time.Since(t0).Seconds())
		b.StopTimer()
		bk.Close()
		b.StartTimer()
	}
	sort.Float64s(rates)
	b.ReportMetric(rates[len(rates)/2], "parks/s")
}

// BenchmarkFork: a sandbox with 100 MiB (random) written is snapshotted
// into a layer and a new sandbox is made over it, up to the end of the
// fork's first command. The snapshot alone is reported too.
func BenchmarkFork(b *testing.B) {
	requireRoot(b)
	for _, mib := range []int{10, 100} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) { benchFork(b, mib) })
	}
}

func benchFork(b *testing.B, mib int) {
	dir := traversableTempDir(b)
	bk := newBackend(b, dir)
	id := benchSandbox(b, bk, "src")
	shB(b, bk, id, fmt.Sprintf(payloads["random"], mib<<20)+"; sleep 1000 >/dev/null 2>&1 &")
	want := shB(b, bk, id, "md5sum /workspace/blob")
	layers := traversableTempDir(b)
	ctx := context.Background()
	var snaps, forks []time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		for bk.WarmReady() < bk.WarmSize() {
			time.Sleep(time.Millisecond)
		}
		dropCaches(b, false)
		dst := filepath.Join(layers, strconv.Itoa(i))
		fork := backendtest.NewID("fork")
		b.StartTimer()
		t0 := time.Now()
		if _, err := bk.Snapshot(ctx, id, dst); err != nil {
			b.Fatal(err)
		}
		snaps = append(snaps, time.Since(t0))
		if _, err := bk.Create(ctx, backend.Spec{ID: fork, Layers: []string{dst}}); err != nil {
			b.Fatal(err)
		}
		mustRun(b, bk, fork, "true")
		forks = append(forks, time.Since(t0))
		b.StopTimer()
		if i == 0 {
			if got := shB(b, bk, fork, "md5sum /workspace/blob"); got != want {
				b.Fatalf("fork: %q, want %q", got, want)
			}
		}
		_ = bk.Destroy(ctx, fork)
		_ = os.RemoveAll(dst)
		b.StartTimer()
	}
	b.StopTimer()
	report(b, "fork-", forks)
	report(b, "snapshot-", snaps)
}
