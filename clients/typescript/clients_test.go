package typescript

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/jstest"
)

// execTimeout is the daemon's default exec deadline in the suite
// (HUTCH_EXEC_TIMEOUT to the tests): short, so that it shows the adapters'
// commands without a timeout are not cut at it (they run as processes,
// which have none).
const execTimeout = "2s"

// TestTypeScript installs the package's locked dependencies, checks that
// the generated API types match api/openapi.yaml, compiles with tsc (which
// type-checks the eve adapter against eve's own types), builds the hutch
// binary, starts `hutch serve` with a TCP listener and an API key, and runs
// the node test suite against it.
func TestTypeScript(t *testing.T) {
	jstest.Need(t, "the TypeScript suite")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	jstest.NPMCI(t, ctx, "")
	if out, err := jstest.Command(ctx, "", nil, "npm", "run", "-s", "check-generated").CombinedOutput(); err != nil {
		t.Fatalf("src/generated/api.ts is stale against api/openapi.yaml; run `npm run generate` in clients/typescript:\n%s", out)
	}
	jstest.Run(t, ctx, "", nil, "npm", "run", "-s", "build")

	d := jstest.Serve(t, jstest.Hutch(t, ctx), "--exec-timeout", execTimeout)
	env := []string{"HUTCH_TCP=http://" + d.TCP, "HUTCH_API_KEY=" + d.Key(t, ctx, "ts-suite", ""), "HUTCH_SOCKET=" + d.Socket,
		"HUTCH_HOST=", "HUTCH_EXEC_TIMEOUT=" + execTimeout}
	files, err := filepath.Glob("dist/test/*.test.js")
	if err != nil || len(files) == 0 {
		t.Fatalf("no compiled test files in dist/test (%v)", err)
	}
	tctx, tcancel := context.WithTimeout(ctx, 3*time.Minute)
	defer tcancel()
	jstest.Node(t, tctx, "", env, files...)
	if left := d.Live(t); len(left) > 0 {
		t.Errorf("the suite left live sandboxes behind: %v", left)
	}
}
