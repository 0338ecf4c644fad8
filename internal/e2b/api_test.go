package e2b_test

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"
)

func TestControlLifecycle(t *testing.T) {
	r := newRig(t)
	c := r.create(map[string]any{"templateID": "base", "timeout": 120, "metadata": map[string]string{"team": "a"},
		"envVars": map[string]string{"FOO": "bar"}})
	if c.SandboxID == "" || c.EnvdAccessToken == "" || c.TemplateID != "base" || c.EnvdVersion == "" {
		t.Fatalf("create answered %+v", c)
	}
	var got created
	if st := r.do("GET", "/sandboxes/"+c.SandboxID, nil, &got); st != 200 || got.State != "running" || got.Metadata["team"] != "a" {
		t.Fatalf("get: %d %+v", st, got)
	}
	end, err := time.Parse(time.RFC3339Nano, got.EndAt)
	if err != nil || time.Until(end) < 100*time.Second || time.Until(end) > 121*time.Second {
		t.Fatalf("endAt %q: want about 120s from now (%v)", got.EndAt, err)
	}
	if st := r.do("POST", "/sandboxes/"+c.SandboxID+"/timeout", map[string]any{"timeout": 600}, nil); st != http.StatusNoContent {
		t.Fatalf("set timeout: %d", st)
	}
	r.do("GET", "/sandboxes/"+c.SandboxID, nil, &got)
	if end, _ = time.Parse(time.RFC3339Nano, got.EndAt); time.Until(end) < 590*time.Second {
		t.Fatalf("after setTimeout(600s) endAt is %v away", time.Until(end))
	}
	if st := r.do("POST", "/sandboxes/"+c.SandboxID+"/pause", map[string]any{}, nil); st != http.StatusNoContent {
		t.Fatalf("pause: %d", st)
	}
	if st := r.do("POST", "/sandboxes/"+c.SandboxID+"/pause", map[string]any{}, nil); st != http.StatusConflict {
		t.Fatalf("second pause: %d, want 409 (the SDK's false)", st)
	}
	r.do("GET", "/sandboxes/"+c.SandboxID, nil, &got)
	if got.State != "paused" {
		t.Fatalf("after pause state %q", got.State)
	}
	var conn created
	if st := r.do("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", map[string]any{"timeout": 60}, &conn); st != http.StatusCreated || conn.State != "running" || conn.EnvdAccessToken != c.EnvdAccessToken {
		t.Fatalf("connect to paused: %d %+v", st, conn)
	}
	if st := r.do("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", map[string]any{"timeout": 60}, &conn); st != http.StatusOK {
		t.Fatalf("connect to running: %d, want 200", st)
	}
	if st := r.do("POST", "/sandboxes/"+c.SandboxID+"/resume", map[string]any{}, nil); st != http.StatusConflict {
		t.Fatalf("v1 resume of a running sandbox: %d, want 409", st)
	}
	if st := r.do("POST", "/sandboxes/"+c.SandboxID+"/refreshes", map[string]any{"duration": 30}, nil); st != http.StatusNoContent {
		t.Fatalf("refresh: %d", st)
	}
	if st := r.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil); st != http.StatusNoContent {
		t.Fatalf("kill: %d", st)
	}
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if st := r.do("DELETE", "/sandboxes/"+c.SandboxID, nil, &e); st != 404 || e.Code != 404 || e.Message == "" {
		t.Fatalf("second kill: %d %+v, want E2B's 404 body", st, e)
	}
	if st := r.do("GET", "/sandboxes/"+c.SandboxID, nil, nil); st != 404 {
		t.Fatalf("get after kill: %d", st)
	}
}

func TestSuspendWithoutMemory(t *testing.T) {
	r := newRig(t)
	c := r.create(map[string]any{"templateID": "base"})
	if st := r.do("POST", "/sandboxes/"+c.SandboxID+"/pause", map[string]any{"memory": false}, nil); st != http.StatusNoContent {
		t.Fatalf("pause without memory: %d", st)
	}
	sb, err := r.mgr.Get(t.Context(), "", c.SandboxID)
	if err != nil || sb.State != "suspended" {
		t.Fatalf("hutch state %q (%v), want suspended", sb.State, err)
	}
	var got created
	if r.do("GET", "/sandboxes/"+c.SandboxID, nil, &got); got.State != "paused" {
		t.Fatalf("E2B state %q, want paused", got.State)
	}
	if st := r.do("POST", "/sandboxes/"+c.SandboxID+"/resume", map[string]any{"timeout": 60}, &got); st != http.StatusCreated || got.State != "running" {
		t.Fatalf("v1 resume: %d %+v", st, got)
	}
}

func TestListFiltersAndPages(t *testing.T) {
	r := newRig(t)
	var ids []string
	for i := range 3 {
		ids = append(ids, r.create(map[string]any{"metadata": map[string]string{"run": "x", "i": fmt.Sprint(i)}}).SandboxID)
	}
	other := r.create(map[string]any{"metadata": map[string]string{"run": "y"}})
	r.do("POST", "/sandboxes/"+ids[2]+"/pause", map[string]any{}, nil)

	md := url.QueryEscape("run=x")
	var seen []string
	next := ""
	for pages := 0; ; pages++ {
		q := "/v2/sandboxes?limit=2&metadata=" + md
		if next != "" {
			q += "&nextToken=" + url.QueryEscape(next)
		}
		req, _ := http.NewRequest("GET", r.url+q, nil)
		req.Header.Set("X-API-KEY", r.key)
		resp, err := r.client.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("list: %v %v", err, resp)
		}
		var page []created
		if err := jsonDecode(resp, &page); err != nil {
			t.Fatal(err)
		}
		for _, p := range page {
			seen = append(seen, p.SandboxID)
			if p.EnvdAccessToken != "" {
				t.Fatal("a listing handed out an envd access token")
			}
		}
		next = resp.Header.Get("X-Next-Token")
		if next == "" {
			break
		}
		if pages > 3 {
			t.Fatal("pagination does not end")
		}
	}
	if fmt.Sprint(seen) != fmt.Sprint(ids) {
		t.Fatalf("listed %v, want %v (in start order, without %s)", seen, ids, other.SandboxID)
	}
	var running []created
	r.do("GET", "/v2/sandboxes?state=paused&metadata="+md, nil, &running)
	if len(running) != 1 || running[0].SandboxID != ids[2] {
		t.Fatalf("state=paused listed %+v", running)
	}
	var v1 []created
	r.do("GET", "/sandboxes?metadata="+md, nil, &v1)
	if len(v1) != 2 {
		t.Fatalf("v1 list (running only) has %d, want 2", len(v1))
	}
	if st := r.do("GET", "/v2/sandboxes?state=gone", nil, nil); st != 400 {
		t.Fatalf("bad state filter: %d", st)
	}
	if st := r.do("GET", "/v2/sandboxes?nextToken=%21%21", nil, nil); st != 400 {
		t.Fatalf("bad token: %d", st)
	}
}

func TestControlErrorsAndRouting(t *testing.T) {
	r := newRig(t)
	if st := r.doKey("", "GET", "/v2/sandboxes", nil, nil); st != 401 {
		t.Fatalf("no key: %d", st)
	}
	if st := r.doKey("hk_wrong", "GET", "/v2/sandboxes", nil, nil); st != 401 {
		t.Fatalf("bad key: %d", st)
	}
	if st := r.do("POST", "/v2/sandboxes", map[string]any{"timeout": -5}, nil); st != 400 {
		t.Fatalf("negative timeout: %d", st)
	}
	// This rig's manager has no networking: closing the network is fine,
	// opening it is refused, a SOCKS5 egress proxy is not offered.
	var closed struct{ SandboxID string }
	if st := r.do("POST", "/v2/sandboxes", map[string]any{"network": map[string]any{"denyOut": []string{"0.0.0.0/0"}}}, &closed); st != 201 {
		t.Fatalf("network denyOut all: %d, want 201", st)
	}
	if p, err := r.mgr.NetworkPolicy(t.Context(), "", closed.SandboxID); err != nil || p.Mode != "deny-all" {
		t.Fatalf("denyOut all made %+v (%v)", p, err)
	}
	if st := r.do("POST", "/v2/sandboxes", map[string]any{"network": map[string]any{"allowOut": []string{"a.example"},
		"denyOut": []string{"0.0.0.0/0"}}}, nil); st != 412 {
		t.Fatalf("allowOut without networking: %d, want 412", st)
	}
	if st := r.do("POST", "/v2/sandboxes", map[string]any{"network": map[string]any{"egressProxy": map[string]any{"address": "p:1080"}}}, nil); st != 501 {
		t.Fatalf("egressProxy: %d, want 501", st)
	}
	if st := r.do("POST", "/v2/sandboxes", map[string]any{"templateID": "no-such-template"}, nil); st != 404 {
		t.Fatalf("unknown template: %d, want 404", st)
	}
	if st := r.do("GET", "/sandboxes/sbx-nope/metrics", nil, nil); st != 501 {
		t.Fatalf("metrics: %d, want 501", st)
	}
	// Another tenant's sandbox is not there.
	c := r.create(nil)
	_, other, _ := r.st.CreateKey(t.Context(), "b", "tenant-b", nil)
	if st := r.doKey(other, "GET", "/sandboxes/"+c.SandboxID, nil, nil); st != 404 {
		t.Fatalf("other tenant's get: %d", st)
	}
	// hutch's own API and unknown hosts pass through.
	for _, p := range []string{"/v1/sandboxes", "/metrics"} {
		if st := r.do("GET", p, nil, nil); st != http.StatusTeapot {
			t.Fatalf("%s: %d, want it passed through", p, st)
		}
	}
	req, _ := http.NewRequest("GET", r.url+"/v1/health", nil)
	req.Host = "8080-" + c.SandboxID + ".hutch.test"
	if resp, err := r.client.Do(req); err != nil || resp.StatusCode != http.StatusTeapot {
		t.Fatalf("another port's host: %v %v, want it passed through", err, resp)
	}
	req, _ = http.NewRequest("GET", r.url+"/health", nil)
	req.Host = "49983-" + c.SandboxID + ".hutch.test"
	if resp, err := r.client.Do(req); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("envd health by host: %v %v", err, resp)
	}
	req, _ = http.NewRequest("GET", r.url+"/v2/sandboxes", nil)
	req.Host = "api.hutch.test"
	req.Header.Set("X-API-KEY", r.key)
	if resp, err := r.client.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("control API by host: %v %v", err, resp)
	}
}

// TestTimeouts: the E2B timeout ends a sandbox (kill), or with autoPause
// suspends it, and connect brings it back with its files.
func TestTimeouts(t *testing.T) {
	r := newRig(t)
	killed := r.create(map[string]any{"timeout": 1})
	paused := r.create(map[string]any{"timeout": 1, "autoPause": true})
	e := r.envd(paused)
	upload(t, e, "kept.txt", "kept")
	deadline := time.Now().Add(20 * time.Second)
	for {
		var got created
		stKilled := r.do("GET", "/sandboxes/"+killed.SandboxID, nil, nil)
		r.do("GET", "/sandboxes/"+paused.SandboxID, nil, &got)
		if stKilled == 404 && got.State == "paused" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the timeout: killed one answers %d, auto-paused one is %q", stKilled, got.State)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var conn created
	if st := r.do("POST", "/v2/sandboxes/"+paused.SandboxID+"/connect", map[string]any{"timeout": 60}, &conn); st != http.StatusCreated {
		t.Fatalf("connect: %d", st)
	}
	if got := download(t, e, "kept.txt", 200); got != "kept" {
		t.Fatalf("after auto-pause and connect: %q", got)
	}
}
