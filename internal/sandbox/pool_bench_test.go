package sandbox_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/blob"
	"github.com/hutch-dev/hutch/internal/sandbox"
	"github.com/hutch-dev/hutch/internal/store"
)

// poolBench is a manager with a template whose warm pool holds size
// running sandboxes.
func poolBench(b *testing.B, size int) (*sandbox.Manager, *native.Backend) {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("needs root (native backend)")
	}
	dir := b.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(dir, "hutch.db"))
	if err != nil {
		b.Fatal(err)
	}
	be, err := native.New(native.Options{DataDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	blobs, _ := blob.NewDir(filepath.Join(dir, "archives"))
	m, err := sandbox.New(ctx, st, be, sandbox.Options{Blobs: blobs, LayerDir: filepath.Join(dir, "layers"),
		PoolInterval: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		sbs, _, _ := m.List(ctx, "", sandbox.ListOptions{Limit: 1000})
		for _, sb := range sbs {
			_ = m.Delete(ctx, "", sb.ID)
		}
		_, _ = m.SetPool(ctx, "bench", "warm", 0)
		m.Close()
		be.Close()
		st.Close()
	})
	if _, err := m.PutTemplate(ctx, "bench", "warm", sandbox.TemplateDef{Setup: []string{"echo warm > /opt/w"}}); err != nil {
		b.Fatal(err)
	}
	if _, err := m.SetPool(ctx, "bench", "warm", size); err != nil {
		b.Fatal(err)
	}
	waitFull(b, m, size)
	return m, be
}

func waitFull(b *testing.B, m *sandbox.Manager, size int) {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if tp, err := m.GetTemplate(context.Background(), "bench", "warm"); err == nil && tp.PoolReady >= size {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.Fatalf("the pool did not fill to %d", size)
}

// BenchmarkPoolClaimFirstExec: a create from a template with a full warm
// pool, to the end of its first command (`true`), through the manager.
func BenchmarkPoolClaimFirstExec(b *testing.B) {
	m, be := poolBench(b, 4)
	ctx := context.Background()
	d := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		sb, err := m.Create(ctx, "bench", sandbox.Spec{Template: "warm"})
		if err != nil {
			b.Fatal(err)
		}
		p, err := be.Exec(ctx, sb.ID, backend.ExecRequest{Cmd: "true"})
		if err != nil {
			b.Fatal(err)
		}
		if st, err := backend.Wait(p, nil, nil); err != nil || st.Code != 0 {
			b.Fatalf("%+v %v", st, err)
		}
		p.Close()
		d = append(d, time.Since(t0))
		b.StopTimer()
		_ = m.Delete(ctx, "", sb.ID)
		waitFull(b, m, 4)
		b.StartTimer()
	}
	report(b, d)
}

// BenchmarkPoolClaimBurst: how many claims a second a full pool of 32
// hands out, back to back (its refill is not part of it).
func BenchmarkPoolClaimBurst(b *testing.B) {
	const size = 32
	m, _ := poolBench(b, size)
	ctx := context.Background()
	var total time.Duration
	claims := 0
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		var ids []string
		for range size {
			sb, err := m.Create(ctx, "bench", sandbox.Spec{Template: "warm"})
			if err != nil {
				b.Fatal(err)
			}
			ids = append(ids, sb.ID)
		}
		total += time.Since(t0)
		claims += size
		b.StopTimer()
		for _, id := range ids {
			_ = m.Delete(ctx, "", id)
		}
		waitFull(b, m, size)
		b.StartTimer()
	}
	b.ReportMetric(float64(claims)/total.Seconds(), "claims/s")
}

func report(b *testing.B, d []time.Duration) {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	pct := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.95), "p95-ms")
	b.ReportMetric(float64(d[0].Microseconds())/1000, "min-ms")
}
