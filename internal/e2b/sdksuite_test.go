package e2b_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/jstest"
)

// TestE2BSDK runs the e2b SDK's own client, unchanged, against a real
// `hutch serve`: npm ci in testdata/sdk, build the hutch binary, start it
// with a TCP listener, make an API key over its socket, and run the node
// test file with the variables a user sets (E2B_API_URL, E2B_SANDBOX_URL,
// E2B_API_KEY).
func TestE2BSDK(t *testing.T) {
	jstest.Need(t, "the e2b SDK suite")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir, err := filepath.Abs("testdata/sdk")
	if err != nil {
		t.Fatal(err)
	}
	jstest.NPMCI(t, ctx, dir)
	d := jstest.Serve(t, jstest.Hutch(t, ctx))
	url := "http://" + d.TCP
	env := []string{"E2B_API_URL=" + url, "E2B_SANDBOX_URL=" + url, "E2B_API_KEY=" + d.Key(t, ctx, "e2b-suite", ""),
		"E2B_DOMAIN=", "E2B_DEBUG="}
	tctx, tcancel := context.WithTimeout(ctx, 150*time.Second)
	defer tcancel()
	jstest.Node(t, tctx, dir, env, "e2b.test.mjs")
}
