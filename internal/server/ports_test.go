package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/daemon"
)

// portServer answers every request with its URL and headers as JSON, and
// echoes WebSocket text frames (short ones) with "echo:" in front. Plain
// node, no packages: the host base has the host's /usr.
const portServer = `
const http = require('http'), crypto = require('crypto');
const s = http.createServer((q, r) => {
  r.setHeader('content-type', 'application/json');
  r.end(JSON.stringify({url: q.url, headers: q.headers}));
});
s.on('upgrade', (q, sock) => {
  const a = crypto.createHash('sha1').update(q.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  sock.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + a + '\r\n\r\n');
  sock.on('data', b => {
    if ((b[0] & 15) !== 1) return;
    const len = b[1] & 127, mask = b.slice(2, 6), p = Buffer.alloc(len);
    for (let i = 0; i < len; i++) p[i] = b[6 + i] ^ mask[i % 4];
    const out = Buffer.from('echo:' + p.toString());
    sock.write(Buffer.concat([Buffer.from([0x81, out.length]), out]));
  });
});
s.listen(8001, '127.0.0.1');
`

type echoed struct {
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
}

func TestExposedPorts(t *testing.T) {
	if _, err := os.Stat("/usr/bin/node"); err != nil {
		t.Skip("the exposed-port test runs a node server in the sandbox (from the host base): node is missing")
	}
	d := ownDaemon(t, func(c *daemon.Config) { c.Domain = "hutch.test" })
	a, _ := newTenant(t, d, "ports-a")
	b, _ := newTenant(t, d, "ports-b")
	anon := remote(t, d, "")
	sb := newSandbox(t, a, api.CreateSandboxRequest{}) // deny-all: ports need no network
	id := sb.Id
	a.mustJSON("PUT", sbPath(id, "/files?path=srv.js"), portServer, http.StatusOK, nil)
	a.sh(id, "nohup node /workspace/srv.js >/dev/null 2>&1 &")
	waitFor(t, "the node server", 10*time.Second, func() bool {
		res := a.exec(id, api.ExecRequest{Cmd: "busybox wget -qO- http://127.0.0.1:8001/ready"})
		return res.ExitCode != nil && *res.ExitCode == 0
	})
	path := sbPath(id, "/ports/8001/hello?x=1")

	// Not exposed yet.
	checkErr(t, "before expose", a.do("GET", path, nil), "not_found")

	var ep api.ExposedPort
	a.mustJSON("POST", sbPath(id, "/ports"), api.ExposePortRequest{Port: 8001}, http.StatusOK, &ep)
	if ep.Token == "" || ep.Path != "/v1/sandboxes/"+id+"/ports/8001/" || ep.Url != "http://8001-"+id+".hutch.test/" {
		t.Fatalf("exposed: %+v", ep)
	}
	var list api.ExposedPortList
	a.mustJSON("GET", sbPath(id, "/ports"), nil, http.StatusOK, &list)
	if len(list.Ports) != 1 || list.Ports[0].Token != ep.Token {
		t.Fatalf("list: %+v", list)
	}
	checkErr(t, "other tenant lists", b.do("GET", sbPath(id, "/ports"), nil), "not_found")

	get := func(c *client, p string, hdr ...string) (resp, echoed) {
		t.Helper()
		r := c.do("GET", p, nil, hdr...)
		var e echoed
		if r.Status == http.StatusOK {
			if err := json.Unmarshal(r.Body, &e); err != nil {
				t.Fatalf("%s: %s", p, r)
			}
		}
		return r, e
	}
	// The tenant's key opens it, and never reaches the sandbox.
	r, e := get(a, path)
	if r.Status != http.StatusOK || e.URL != "/hello?x=1" || e.Headers["authorization"] != "" {
		t.Fatalf("with the key: %s", r)
	}
	// The local socket too.
	if r, _ := get(local(t, d), path); r.Status != http.StatusOK {
		t.Fatalf("over the socket: %s", r)
	}
	// Nothing, a wrong token, another tenant's key: refused.
	checkErr(t, "no key", anon.do("GET", path, nil), "unauthenticated")
	checkErr(t, "wrong token", anon.do("GET", path, nil, "X-Hutch-Port-Token", "hpt_wrong"), "permission_denied")
	checkErr(t, "other tenant", b.do("GET", path, nil), "not_found")
	// The token, as a header or in the query; neither reaches the sandbox.
	r, e = get(anon, path, "X-Hutch-Port-Token", ep.Token)
	if r.Status != http.StatusOK || e.Headers["x-hutch-port-token"] != "" {
		t.Fatalf("token header: %s", r)
	}
	r, e = get(anon, path+"&hutch_port_token="+ep.Token)
	if r.Status != http.StatusOK || strings.Contains(e.URL, "hutch_port_token") {
		t.Fatalf("token query: %s", r)
	}
	// An app's own Authorization header passes through to it.
	r, e = get(anon, path, "X-Hutch-Port-Token", ep.Token, "Authorization", "Bearer app-token")
	if r.Status != http.StatusOK || e.Headers["authorization"] != "Bearer app-token" {
		t.Fatalf("app authorization: %s", r)
	}

	// By host, under the daemon's domain.
	req, _ := http.NewRequest("GET", "http://"+d.TCPAddr+"/by-host", nil)
	req.Host = "8001-" + id + ".hutch.test"
	req.Header.Set("X-Hutch-Port-Token", ep.Token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var byHost echoed
	_ = json.NewDecoder(res.Body).Decode(&byHost)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || byHost.URL != "/by-host" || !strings.HasPrefix(byHost.Headers["host"], "8001-"+id) {
		t.Fatalf("by host: %d %+v", res.StatusCode, byHost)
	}

	// WebSocket, with the token.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+d.TCPAddr+sbPath(id, "/ports/8001/ws"),
		&websocket.DialOptions{HTTPHeader: http.Header{"X-Hutch-Port-Token": {ep.Token}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	_, msg, err := ws.Read(ctx)
	if err != nil || string(msg) != "echo:ping" {
		t.Fatalf("websocket: %q %v", msg, err)
	}
	ws.CloseNow()
	if _, _, err := websocket.Dial(ctx, "ws://"+d.TCPAddr+sbPath(id, "/ports/8001/ws"),
		&websocket.DialOptions{HTTPHeader: http.Header{"X-Hutch-Port-Token": {"hpt_wrong"}}}); err == nil {
		t.Fatal("a WebSocket with a wrong token was let in")
	}

	// Public: no key or token needed; the old token is gone.
	var pub api.ExposedPort
	a.mustJSON("POST", sbPath(id, "/ports"), api.ExposePortRequest{Port: 8001, Public: true}, http.StatusOK, &pub)
	if r, _ := get(anon, path); r.Status != http.StatusOK || pub.Token == ep.Token {
		t.Fatalf("public: %s", r)
	}
	// A port nothing listens on answers 503.
	a.mustJSON("POST", sbPath(id, "/ports"), api.ExposePortRequest{Port: 8009}, http.StatusOK, nil)
	checkErr(t, "nothing listening", a.do("GET", sbPath(id, "/ports/8009/"), nil), "unavailable")
	// Unexposed: gone.
	if r := a.do("DELETE", sbPath(id, "/ports/8001"), nil); r.Status != http.StatusNoContent {
		t.Fatalf("unexpose: %s", r)
	}
	checkErr(t, "after unexpose", anon.do("GET", path, nil), "not_found")
	checkErr(t, "bad port", a.do("POST", sbPath(id, "/ports"), api.ExposePortRequest{Port: 70000}), "invalid_argument")
}
