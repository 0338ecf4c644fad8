// Package daemontest starts a real hutch daemon (native backend, SQLite
// store, unix socket and TCP listener) inside a test binary. The test
// binary must dispatch sandbox inits first thing in TestMain:
//
//	func TestMain(m *testing.M) {
//		if native.IsInit() {
//			native.InitMain()
//		}
//		os.Exit(m.Run())
//	}
package daemontest

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/hutch-dev/hutch/internal/daemon"
)

// Start runs a daemon on a fresh data directory for the test's lifetime.
// It skips the test when not root.
func Start(t testing.TB, mutate ...func(*daemon.Config)) *daemon.Daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a real daemon needs root (the native backend maps uid ranges and makes idmapped mounts)")
	}
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	cfg := daemon.Config{DataDir: dir, Listen: "127.0.0.1:0", Version: "test",
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	for _, f := range mutate {
		f(&cfg)
	}
	d, err := daemon.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start daemon: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		// Pooled sandboxes outlive a daemon (pools survive restarts), and a
		// claim refills its pool a moment later: empty the pools first.
		if tpls, err := d.Manager.ListTemplates(ctx, "", true); err == nil {
			for _, tpl := range tpls {
				if tpl.PoolSize > 0 {
					_, _ = d.Manager.SetPool(ctx, tpl.Tenant, tpl.Name, 0)
				}
			}
		}
		sbs, _, _ := d.Manager.List(ctx, "", sandboxListAll())
		for _, sb := range sbs {
			_ = d.Manager.Delete(ctx, "", sb.ID)
		}
		_ = d.Stop()
	})
	return d
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
