package provider_test

import (
	"os"
	"testing"

	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/daemon/daemontest"
	hutch "github.com/hutch-dev/hutch/sdk"
	"github.com/hutch-dev/hutch/sdk/provider/e2bp"
	"github.com/hutch-dev/hutch/sdk/provider/hutchp"
	"github.com/hutch-dev/hutch/sdk/provider/providertest"
)

func TestMain(m *testing.M) {
	if native.IsInit() {
		native.InitMain()
	}
	os.Exit(m.Run())
}

// TestProviders drives the same Go code through both doors of one real
// daemon: hutch's own API (hutchp) and hutch's E2B endpoint (e2bp, the
// provider that also drives E2B's cloud), both over TCP with one API key.
func TestProviders(t *testing.T) {
	d := daemontest.Start(t)
	_, secret, err := d.Store.CreateKey(t.Context(), "providers", "tenant-p", nil)
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + d.TCPAddr
	t.Run("hutch", func(t *testing.T) {
		c, err := hutch.New(url, secret)
		if err != nil {
			t.Fatal(err)
		}
		providertest.Run(t, hutchp.New(c))
	})
	t.Run("e2b", func(t *testing.T) {
		p, err := e2bp.New(e2bp.Config{APIKey: secret, APIURL: url, SandboxURL: url})
		if err != nil {
			t.Fatal(err)
		}
		providertest.Run(t, p)
	})
}
