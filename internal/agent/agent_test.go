package agent_test

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/agent"
	"github.com/hutch-dev/hutch/internal/backend"
)

// startAgent runs an agent in this process on a temp socket. It reaps only
// its own commands, so the test process's other children are safe.
func startAgent(t *testing.T) *agent.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	srv := agent.New(agent.Config{Cwd: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}})
	go srv.Serve(ln)
	return &agent.Client{Socket: sock}
}

func TestExecRoundTrip(t *testing.T) {
	cl := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := cl.Exec(ctx, backend.ExecRequest{Cmd: "echo hi; echo err >&2; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var out, errb bytes.Buffer
	st, err := backend.Wait(p, &out, &errb)
	if err != nil || st.Code != 3 || out.String() != "hi\n" || errb.String() != "err\n" {
		t.Fatalf("got %q %q %+v %v", out.String(), errb.String(), st, err)
	}
}
