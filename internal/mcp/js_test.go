package mcp_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/jstest"
)

// TestTypeScriptClient runs testdata/js/mcp.test.mjs: the official
// TypeScript MCP client (@modelcontextprotocol/sdk from npm) against a real
// `hutch serve`, over stdio (it spawns `hutch mcp`) and streamable HTTP
// with two tenants' API keys.
func TestTypeScriptClient(t *testing.T) {
	jstest.Need(t, "the TypeScript MCP client test")
	t.Parallel()
	dir, err := filepath.Abs("testdata/js")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	jstest.NPMCI(t, ctx, dir)
	bin := jstest.Hutch(t, ctx)
	d := jstest.Serve(t, bin)
	env := []string{"HUTCH_BIN=" + bin, "HUTCH_SOCKET=" + d.Socket, "HUTCH_MCP_URL=http://" + d.TCP + "/mcp"}
	for _, tenant := range []string{"A", "B"} {
		env = append(env, "HUTCH_KEY_"+tenant+"="+d.Key(t, ctx, "ts-"+tenant, "ts-"+tenant))
	}
	jstest.Node(t, ctx, dir, env, "mcp.test.mjs")
}
