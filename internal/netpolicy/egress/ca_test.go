package egress

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

func TestCAPersistsAndSignsLeaves(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ca")
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{caKeyFile: 0o600, caCertFile: 0o644, ".": 0o700} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want %v", name, fi.Mode().Perm(), err, want)
		}
	}
	again, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if string(again.CertPEM()) != string(ca.CertPEM()) {
		t.Error("loading the CA made a new one")
	}
	leaf, err := ca.Leaf("API.Example.com.")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(again.CertPEM())
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: roots}); err != nil {
		t.Errorf("leaf does not verify against the CA: %v", err)
	}
	if again, _ := ca.Leaf("api.example.com"); again != leaf {
		t.Error("leaf not cached")
	}
	// Near its end a cached leaf is replaced.
	ca.now = func() time.Time { return time.Now().Add(leafValidity - time.Hour) }
	if renewed, _ := ca.Leaf("api.example.com"); renewed == leaf {
		t.Error("a leaf about to expire was served from the cache")
	}
	if _, err := ca.Leaf("not a name"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("leaf for a bad name: %v", err)
	}
}

func TestCARefusesBadFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := LoadOrCreateCA(dir); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, caKeyFile)
	os.Chmod(key, 0o644)
	if _, err := LoadOrCreateCA(dir); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("world-readable key: %v", err)
	}
	os.Chmod(key, 0o600)
	// A key from another CA.
	other := t.TempDir()
	if _, err := LoadOrCreateCA(other); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(other, caKeyFile))
	os.WriteFile(key, b, 0o600)
	if _, err := LoadOrCreateCA(dir); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("mismatched key: %v", err)
	}
	os.WriteFile(filepath.Join(dir, caCertFile), []byte("garbage"), 0o644)
	if _, err := LoadOrCreateCA(dir); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("garbage certificate: %v", err)
	}
	// Half a CA (a crash between the writes) is made anew.
	os.Remove(filepath.Join(dir, caCertFile))
	if _, err := LoadOrCreateCA(dir); err != nil {
		t.Errorf("half a CA: %v", err)
	}
}
