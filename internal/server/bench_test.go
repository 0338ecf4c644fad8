package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/backend"
)

// The exec round trip of `true` through the whole API (HTTP, auth,
// JSON, manager lookup, agent), beside the bare backend call and a bare
// fork/exec, in one run:
//
//	CGO_ENABLED=0 go test -run '^$' -bench ExecRoundTrip -benchtime 300x ./internal/server/
//
// The API's own cost is the Unix (or TCP) p50 minus the Backend p50.

// measure runs fn b.N times and reports the p50 and p95 of one run in ms
// (the pattern of internal/backend/native/bench_test.go).
func measure(b *testing.B, fn func()) {
	b.Helper()
	d := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		fn()
		d = append(d, time.Since(t0))
	}
	b.StopTimer()
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	pct := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.95), "p95-ms")
	b.ReportMetric(float64(d[0].Microseconds())/1000, "min-ms")
}

// benchExec measures POST /exec {"cmd":"true"} through c, keep-alive.
func benchExec(b *testing.B, c *client) {
	id := newSandbox(b, c, api.CreateSandboxRequest{}).Id
	body, _ := json.Marshal(api.ExecRequest{Cmd: "true"})
	url := c.base + sbPath(id, "/exec")
	run := func() {
		req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if c.key != "" {
			req.Header.Set("Authorization", "Bearer "+c.key)
		}
		res, err := c.hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		var out api.ExecResult
		err = json.NewDecoder(res.Body).Decode(&out)
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if err != nil || res.StatusCode != 200 || out.ExitCode == nil || *out.ExitCode != 0 {
			b.Fatalf("exec: %d %+v %v", res.StatusCode, out, err)
		}
	}
	for range 20 { // warm the connection and the sandbox
		run()
	}
	measure(b, run)
}

func BenchmarkExecRoundTripUnix(b *testing.B) {
	benchExec(b, local(b, shared(b)))
}

func BenchmarkExecRoundTripTCP(b *testing.B) {
	d := shared(b)
	c, _ := newTenant(b, d, "bench")
	benchExec(b, c)
}

// BenchmarkExecRoundTripBackend: the same command through the backend
// alone (what the API adds nothing to).
func BenchmarkExecRoundTripBackend(b *testing.B) {
	d := shared(b)
	id := newSandbox(b, local(b, d), api.CreateSandboxRequest{}).Id
	ctx := context.Background()
	run := func() {
		p, err := d.Backend.Exec(ctx, id, backend.ExecRequest{Cmd: "true"})
		if err != nil {
			b.Fatal(err)
		}
		st, err := backend.Wait(p, nil, nil)
		p.Close()
		if err != nil || st.Code != 0 {
			b.Fatalf("%+v %v", st, err)
		}
	}
	for range 20 {
		run()
	}
	measure(b, run)
}

// BenchmarkExecRoundTripForkExec: /bin/true from Go, no sandbox at all.
func BenchmarkExecRoundTripForkExec(b *testing.B) {
	measure(b, func() {
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	})
}
