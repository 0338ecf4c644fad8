package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// bumpShared increments the shared sandbox's version the way the manager
// would: read, modify, write, and on ErrConflict read again.
func bumpShared(ctx context.Context, s *Store, conflicts *atomic.Int64) error {
	for {
		sb, err := s.GetSandbox(ctx, "", "shared")
		if err != nil {
			return err
		}
		sb.Metadata = map[string]string{"last": fmt.Sprint(sb.Version)}
		_, err = s.UpdateSandbox(ctx, sb)
		if !errors.Is(err, errdefs.ErrConflict) {
			return err
		}
		conflicts.Add(1)
	}
}

// worker does its share of inserts, updates, reads and authentications; any
// error (a "database is locked" above all) fails the test.
func worker(ctx context.Context, s *Store, g, n int, secret string, conflicts *atomic.Int64) error {
	for i := range n {
		id := fmt.Sprintf("g%d_%03d", g, i)
		sb, err := s.InsertSandbox(ctx, Sandbox{ID: id, Tenant: fmt.Sprintf("t%d", g), State: "creating",
			Labels: map[string]string{"g": fmt.Sprint(g), "i": fmt.Sprint(i)}})
		if err != nil {
			return err
		}
		sb.State = "running"
		if _, err := s.UpdateSandbox(ctx, sb); err != nil {
			return err
		}
		if err := bumpShared(ctx, s, conflicts); err != nil {
			return err
		}
		if _, err := s.Authenticate(ctx, secret); err != nil {
			return err
		}
		if _, _, err := s.ListSandboxes(ctx, ListFilter{Labels: map[string]string{"g": fmt.Sprint(g)}, Limit: 10}); err != nil {
			return err
		}
	}
	return nil
}

func TestConcurrentWriters(t *testing.T) {
	const goroutines, perG = 8, 50
	s, _ := openTest(t)
	ctx := context.Background()
	must[Sandbox](t)(s.InsertSandbox(ctx, Sandbox{ID: "shared", State: "running"}))
	_, secret := must2(t)(s.CreateKey(ctx, "k", "", nil))
	var conflicts atomic.Int64
	runWorkers(t, goroutines, func(g int) error { return worker(ctx, s, g, perG, secret, &conflicts) })
	checkFinal(t, s, goroutines, perG)
	t.Logf("%d optimistic-concurrency conflicts retried", conflicts.Load())
}

// Two Stores on one file stand in for two daemons: their writers contend
// for the file lock, which busy_timeout and BEGIN IMMEDIATE must absorb.
func TestTwoStoresOneFile(t *testing.T) {
	const goroutines, perG = 8, 25
	path := filepath.Join(t.TempDir(), "hutch.db")
	ctx := context.Background()
	stores := make([]*Store, 2)
	for i := range stores {
		s, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		stores[i] = s
	}
	must[Sandbox](t)(stores[0].InsertSandbox(ctx, Sandbox{ID: "shared", State: "running"}))
	_, secret := must2(t)(stores[0].CreateKey(ctx, "k", "", nil))
	var conflicts atomic.Int64
	runWorkers(t, goroutines, func(g int) error { return worker(ctx, stores[g%2], g, perG, secret, &conflicts) })
	checkFinal(t, stores[1], goroutines, perG)
}

func runWorkers(t *testing.T, n int, fn func(g int) error) {
	t.Helper()
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			if err := fn(g); err != nil {
				t.Errorf("worker %d: %v", g, err)
			}
		})
	}
	wg.Wait()
}

func checkFinal(t *testing.T, s *Store, goroutines, perG int) {
	t.Helper()
	ctx := context.Background()
	shared := must[Sandbox](t)(s.GetSandbox(ctx, "", "shared"))
	if want := int64(1 + goroutines*perG); shared.Version != want {
		t.Errorf("shared version = %d, want %d (a lost update)", shared.Version, want)
	}
	var rows, labels, running int
	s.r.QueryRow(`SELECT count(*), count(*) FILTER (WHERE state = 'running' AND version = 2) FROM sandboxes WHERE id != 'shared'`).Scan(&rows, &running)
	s.r.QueryRow(`SELECT count(*) FROM sandbox_labels`).Scan(&labels)
	if want := goroutines * perG; rows != want || running != want || labels != 2*want {
		t.Errorf("%d sandboxes (%d running at v2), %d label rows; want %d, %d, %d", rows, running, labels, want, want, 2*want)
	}
	var ok string
	if err := s.r.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
		t.Errorf("integrity_check = %q, %v", ok, err)
	}
}
