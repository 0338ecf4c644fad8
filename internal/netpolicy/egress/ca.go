package egress

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// The CA's files in its directory. The key is 0600; the certificate is
// what the daemon installs in each sandbox's trust store.
const (
	caCertFile = "ca.crt"
	caKeyFile  = "ca.key"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 7 * 24 * time.Hour
	// leafRenewal: a cached leaf with less than this left is replaced, so
	// no handshake is served a certificate about to expire.
	leafRenewal  = 24 * time.Hour
	maxLeafCache = 4096
)

// CA is the per-daemon certificate authority of the credential
// interception. Sandboxes trust it; it signs short-lived leaf certificates
// for the hosts the proxy terminates TLS for, cached per host.
type CA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
	now    func() time.Time // tests move the clock
}

// LoadOrCreateCA loads the CA kept in dir, or creates one there. dir is
// created 0700 if missing. A key file readable by anyone but its owner, or
// a certificate and key that do not belong together, is an error rather
// than something to repair silently: the key may have leaked, or the files
// were tampered with. When only one of the two files exists (a crash
// between the two writes), both are made anew: no sandbox can trust a CA
// whose certificate was never written.
func LoadOrCreateCA(dir string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("egress CA dir: %w", err)
	}
	certPath, keyPath := filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile)
	certPEM, certErr := os.ReadFile(certPath)
	keyInfo, keyErr := os.Stat(keyPath)
	switch {
	case certErr == nil && keyErr == nil:
		if keyInfo.Mode().Perm()&0o077 != 0 {
			return nil, errdefs.New(errdefs.ErrFailedPrecondition,
				"egress CA key %s has mode %v: want 0600 (delete the CA files to make a new CA)", keyPath, keyInfo.Mode().Perm())
		}
		keyPEM, err := os.ReadFile(keyPath)
		if err != nil {
			return nil, fmt.Errorf("egress CA key: %w", err)
		}
		return parseCA(certPEM, keyPEM, certPath)
	case errors.Is(certErr, fs.ErrNotExist) || errors.Is(keyErr, fs.ErrNotExist):
		return createCA(certPath, keyPath)
	case certErr != nil:
		return nil, fmt.Errorf("egress CA certificate: %w", certErr)
	default:
		return nil, fmt.Errorf("egress CA key: %w", keyErr)
	}
}

func parseCA(certPEM, keyPEM []byte, certPath string) (*CA, error) {
	bad := func(format string, args ...any) error {
		return errdefs.New(errdefs.ErrFailedPrecondition, "egress CA %s: "+format+" (delete the CA files to make a new CA)",
			append([]any{certPath}, args...)...)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || cb.Type != "CERTIFICATE" || kb == nil || kb.Type != "PRIVATE KEY" {
		return nil, bad("certificate or key is not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, bad("certificate: %v", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, bad("key: %v", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, bad("key does not belong to the certificate")
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, bad("certificate is not a CA")
	}
	if time.Now().After(cert.NotAfter) {
		return nil, bad("certificate expired on %s", cert.NotAfter.Format(time.DateOnly))
	}
	return newCA(cert, key, certPEM), nil
}

func createCA(certPath, keyPath string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress CA key: %w", err)
	}
	id := make([]byte, 6)
	rand.Read(id)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{Organization: []string{"hutch"}, CommonName: "hutch egress CA " + hex.EncodeToString(id)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		// Only leaves, never intermediate CAs, sit below it.
		MaxPathLen:     0,
		MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("egress CA certificate: %w", err)
	}
	cert, _ := x509.ParseCertificate(der)
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("egress CA key: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	// The key goes first: a certificate on disk without its key would be
	// half a CA; the reverse is repaired by LoadOrCreateCA.
	if err := writeAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), 0o600); err != nil {
		return nil, err
	}
	if err := writeAtomic(certPath, certPEM, 0o644); err != nil {
		return nil, err
	}
	return newCA(cert, key, certPEM), nil
}

func newCA(cert *x509.Certificate, key crypto.Signer, certPEM []byte) *CA {
	return &CA{cert: cert, key: key, certPEM: certPEM, leaves: map[string]*tls.Certificate{}, now: time.Now}
}

// writeAtomic writes a file under a temporary name, syncs it and renames
// it into place, so a crash leaves the old file or the new one.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("egress CA: %w", err)
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("egress CA: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("egress CA: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("egress CA: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("egress CA: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("egress CA: %w", err)
	}
	return nil
}

// CertPEM is the CA certificate in PEM form, for the sandboxes' trust
// stores.
func (ca *CA) CertPEM() []byte { return bytes.Clone(ca.certPEM) }

// Certificate returns the CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Leaf returns a certificate for host signed by the CA, from the cache
// while it has more than a day left.
func (ca *CA) Leaf(host string) (*tls.Certificate, error) {
	host = normalizeName(host)
	if host == "" {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "leaf certificate: not a DNS name")
	}
	now := ca.now()
	ca.mu.Lock()
	if c, ok := ca.leaves[host]; ok && c.Leaf.NotAfter.Sub(now) > leafRenewal {
		ca.mu.Unlock()
		return c, nil
	}
	ca.mu.Unlock()
	// Signing happens outside the lock; two concurrent misses for one host
	// both sign, and the later one wins the cache. That is cheaper than
	// making every other host wait.
	c, err := ca.sign(host, now)
	if err != nil {
		return nil, err
	}
	ca.mu.Lock()
	if len(ca.leaves) >= maxLeafCache {
		// A bounded cache: a policy with a wildcard credential rule could
		// otherwise grow it without limit. Dropping it all is rare and
		// only costs re-signing.
		clear(ca.leaves)
	}
	ca.leaves[host] = c
	ca.mu.Unlock()
	return c, nil
}

func (ca *CA) sign(host string, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("leaf key: %w", err)
	}
	notAfter := now.Add(leafValidity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: host},
		DNSNames:              []string{host},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, fmt.Errorf("leaf certificate for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("leaf certificate for %s: %w", host, err)
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

func randomSerial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n.Add(n, big.NewInt(1))
}
