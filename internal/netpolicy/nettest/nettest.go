// Package nettest builds a small "internet" for network tests: one network
// namespace of the test's own whose loopback carries every test host's
// address, with HTTP and HTTPS servers (certificates from a test CA), TCP
// and UDP echo services and a DNS server naming them. Nothing in it is an
// address outside this machine; a daemon under test makes its outbound
// connections from inside this namespace (gateway.Options.EgressNetNS).
package nettest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/hutch-dev/hutch/internal/netpolicy/router"
)

// The test hosts. Each name resolves to its address in the zone.
var Hosts = map[string]netip.Addr{
	"www.test":      netip.MustParseAddr("198.18.0.10"),
	"api.test":      netip.MustParseAddr("198.18.0.11"),
	"evil.test":     netip.MustParseAddr("198.18.0.12"),
	"cdn.pkg.test":  netip.MustParseAddr("198.18.0.13"),
	"meta.test":     netip.MustParseAddr("169.254.169.254"),
	"private.test":  netip.MustParseAddr("10.99.0.1"),
	"loopback.test": netip.MustParseAddr("127.0.0.1"),
}

// DNSAddr is the zone's server.
var DNSAddr = netip.MustParseAddrPort("198.18.0.53:53")

// Internet is a running test internet.
type Internet struct {
	NS     netns.NsHandle
	CAPool *x509.CertPool
	CAPEM  []byte

	mu      sync.Mutex
	queries []string      // DNS names asked, in order
	seen    []http.Header // request headers the HTTP(S) servers got
}

// Start builds the internet for the test's lifetime. It skips without root.
func Start(t testing.TB) *Internet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the test internet needs root (a network namespace of its own)")
	}
	in := &Internet{}
	ns, err := router.NewNS()
	if err != nil {
		t.Skipf("the test internet needs network namespaces: %v", err)
	}
	in.NS = ns
	t.Cleanup(func() { ns.Close() })
	if err := in.addresses(); err != nil {
		t.Fatal(err)
	}
	cert, err := in.makeCA()
	if err != nil {
		t.Fatal(err)
	}
	var closers []io.Closer
	t.Cleanup(func() {
		for _, c := range closers {
			c.Close()
		}
	})
	listen := func(network, addr string) net.Listener {
		var ln net.Listener
		if err := router.InNS(ns, func() (err error) { ln, err = net.Listen(network, addr); return err }); err != nil {
			t.Fatal(err)
		}
		closers = append(closers, ln)
		return ln
	}
	for name, ip := range Hosts {
		if !strings.HasSuffix(name, ".test") || ip.IsLoopback() {
			continue
		}
		h := in.handler(name)
		go (&http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}).Serve(listen("tcp4", ip.String()+":80"))
		tln := tls.NewListener(listen("tcp4", ip.String()+":443"), &tls.Config{Certificates: []tls.Certificate{cert}})
		go (&http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}).Serve(tln)
		go echoTCP(listen("tcp4", ip.String()+":2222"))
	}
	var pc net.PacketConn
	if err := router.InNS(ns, func() (err error) { pc, err = net.ListenPacket("udp4", DNSAddr.String()); return err }); err != nil {
		t.Fatal(err)
	}
	closers = append(closers, pc)
	go in.serveDNS(pc)
	var echo net.PacketConn
	if err := router.InNS(ns, func() (err error) { echo, err = net.ListenPacket("udp4", "198.18.0.10:9999"); return err }); err != nil {
		t.Fatal(err)
	}
	closers = append(closers, echo)
	go echoUDP(echo)
	return in
}

// Path names the namespace for gateway.Options.EgressNetNS.
func (in *Internet) Path() string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(in.NS)) }

// Queries returns the DNS names the zone's server was asked.
func (in *Internet) Queries() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]string(nil), in.queries...)
}

// Seen returns the request headers the HTTP(S) servers received.
func (in *Internet) Seen() []http.Header {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]http.Header(nil), in.seen...)
}

func (in *Internet) addresses() error {
	h, err := netlink.NewHandleAt(in.NS)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return err
	}
	addrs := []netip.Addr{DNSAddr.Addr()}
	for _, ip := range Hosts {
		if !ip.IsLoopback() {
			addrs = append(addrs, ip)
		}
	}
	for _, ip := range addrs {
		if err := h.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return fmt.Errorf("address %s: %w", ip, err)
		}
	}
	return nil
}

// handler answers "served-by=<name> path=<path>", or N zero bytes at
// /bytes/N (for throughput), and records the request's headers.
func (in *Internet) handler(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n, ok := strings.CutPrefix(r.URL.Path, "/bytes/"); ok {
			size, err := strconv.ParseInt(n, 10, 64)
			if err != nil || size < 0 {
				http.Error(w, "bad size", http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Length", n)
			_, _ = io.CopyN(w, zeros{}, size)
			return
		}
		in.mu.Lock()
		in.seen = append(in.seen, r.Header.Clone())
		in.mu.Unlock()
		w.Header().Set("X-Served-By", name)
		fmt.Fprintf(w, "served-by=%s path=%s\n", name, r.URL.Path)
	})
}

func (in *Internet) makeCA() (tls.Certificate, error) {
	var names []string
	for n := range Hosts {
		names = append(names, n)
	}
	ca, err := NewCA("hutch test internet CA", names...)
	if err != nil {
		return tls.Certificate{}, err
	}
	in.CAPool, in.CAPEM = ca.Pool, ca.PEM
	return ca.Leaf, nil
}

// CA is a test certificate authority and one server certificate it signed.
type CA struct {
	PEM  []byte         // the CA certificate
	Pool *x509.CertPool // holding it
	Leaf tls.Certificate
}

// NewCA makes a CA named name (valid a day) and a server certificate for
// names (wildcards allowed) signed by it.
func NewCA(name string, names ...string) (*CA, error) {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(caDER)
	ca := &CA{Pool: x509.NewCertPool(), PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}
	ca.Pool.AddCert(cert)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, cert, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca.Leaf = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return ca, nil
}

func (in *Internet) serveDNS(pc net.PacketConn) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		hdr, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		name := strings.TrimSuffix(strings.ToLower(q.Name.String()), ".")
		in.mu.Lock()
		in.queries = append(in.queries, name)
		in.mu.Unlock()
		resp := dnsmessage.Message{Header: dnsmessage.Header{ID: hdr.ID, Response: true, Authoritative: true},
			Questions: []dnsmessage.Question{q}}
		ip, ok := Hosts[name]
		switch {
		case !ok:
			resp.RCode = dnsmessage.RCodeNameError
		case q.Type == dnsmessage.TypeA:
			resp.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA,
				Class: dnsmessage.ClassINET, TTL: 5}, Body: &dnsmessage.AResource{A: ip.As4()}}}
		}
		out, err := resp.Pack()
		if err == nil {
			_, _ = pc.WriteTo(out, from)
		}
	}
}

func echoTCP(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_, _ = c.Write([]byte("hello from echo\n"))
			_, _ = io.Copy(c, c)
		}()
	}
}

func echoUDP(pc net.PacketConn) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = pc.WriteTo(buf[:n], from)
	}
}

// Ctx is a short deadline for one network check.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
