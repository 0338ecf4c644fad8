package e2b_test

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/jstest"
	"github.com/hutch-dev/hutch/internal/netpolicy/nettest"
	"github.com/hutch-dev/hutch/internal/netpolicy/router"
)

// TestE2BSDK runs the e2b SDK's own client, unchanged, against a real
// `hutch serve`: npm ci in testdata/sdk and build the hutch binary once,
// then for each way a user routes the SDK start a daemon, make an API key
// over its socket, and run a node test file with the variables that user
// sets.
func TestE2BSDK(t *testing.T) {
	jstest.Need(t, "the e2b SDK suite")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	dir, err := filepath.Abs("testdata/sdk")
	if err != nil {
		t.Fatal(err)
	}
	jstest.NPMCI(t, ctx, dir)
	bin := jstest.Hutch(t, ctx)
	t.Run("urls", func(t *testing.T) { sdkByURL(t, ctx, dir, bin) })
	t.Run("domain", func(t *testing.T) { sdkByDomain(t, ctx, dir, bin) })
}

// sdkByURL: E2B_API_URL and E2B_SANDBOX_URL name the daemon's TCP address.
func sdkByURL(t *testing.T, ctx context.Context, dir, bin string) {
	d := jstest.Serve(t, bin)
	url := "http://" + d.TCP
	env := []string{"E2B_API_URL=" + url, "E2B_SANDBOX_URL=" + url, "E2B_API_KEY=" + d.Key(t, ctx, "e2b-suite", ""),
		"E2B_DOMAIN=", "E2B_DEBUG=", "HUTCH_NETWORKED="}
	if err := router.Probe(); err == nil {
		env[len(env)-1] = "HUTCH_NETWORKED=1" // the daemon's --network auto is on: the network test runs
	}
	tctx, tcancel := context.WithTimeout(ctx, 150*time.Second)
	defer tcancel()
	jstest.Node(t, tctx, dir, env, "e2b.test.mjs")
}

// sdkByDomain runs the SDK in its domain mode (E2B_DOMAIN only): it speaks
// HTTPS to api.<domain> and 49983-<id>.<domain>. A TLS front on
// 127.0.0.1:443 (a wildcard certificate from a test CA the node process
// trusts) forwards to `hutch serve --domain`, Host kept, and a preloaded
// module resolves the domain's names to 127.0.0.1, as wildcard DNS would.
func sdkByDomain(t *testing.T, ctx context.Context, dir, bin string) {
	const domain = "hutch.test"
	ln, err := net.Listen("tcp4", "127.0.0.1:443")
	if err != nil {
		t.Skipf("the domain-mode suite needs 127.0.0.1:443 for its TLS front: %v", err)
	}
	d := jstest.Serve(t, bin, "--domain", domain)
	ca, err := nettest.NewCA("e2b domain test CA", "*."+domain)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse("http://" + d.TCP)
	front := &http.Server{Handler: &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host // hutch routes by it
		},
		FlushInterval: -1, // envd streams
	}, TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Leaf}}}
	go func() { _ = front.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = front.Close() })

	env := []string{"E2B_DOMAIN=" + domain, "E2B_API_KEY=" + d.Key(t, ctx, "e2b-domain", ""), "E2B_API_URL=",
		"E2B_SANDBOX_URL=", "E2B_DEBUG=", "NODE_EXTRA_CA_CERTS=" + caFile, "HUTCH_TEST_DOMAIN=" + domain}
	tctx, tcancel := context.WithTimeout(ctx, 90*time.Second)
	defer tcancel()
	jstest.Node(t, tctx, dir, env, "--import=./resolve.mjs", "e2b.domain.test.mjs")
}
