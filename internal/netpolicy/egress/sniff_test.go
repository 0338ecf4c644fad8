package egress

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"
)

// clientHello returns the first flight of a real crypto/tls client
// for serverName (no SNI if empty).
func clientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	a, b := net.Pipe()
	var wg sync.WaitGroup
	wg.Go(func() {
		tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: true}).Handshake()
	})
	defer func() { a.Close(); b.Close(); wg.Wait() }()
	buf := make([]byte, 64<<10)
	n := 0
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		m, err := b.Read(buf[n:])
		n += m
		if n >= 5 && n >= 5+int(binary.BigEndian.Uint16(buf[3:5])) {
			return buf[:n]
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// refragment splits a single-record ClientHello into records of at most
// size payload bytes, as a client may.
func refragment(rec []byte, size int) []byte {
	payload := rec[5:]
	var out []byte
	for len(payload) > 0 {
		n := min(size, len(payload))
		out = append(out, rec[0], rec[1], rec[2], byte(n>>8), byte(n))
		out = append(out, payload[:n]...)
		payload = payload[n:]
	}
	return out
}

func TestSniffTLS(t *testing.T) {
	t.Parallel()
	hello := clientHello(t, "API.GitHub.com")
	st, name := sniffTLS(hello)
	if st != found || name != "api.github.com" {
		t.Fatalf("sniff = %v %q", st, name)
	}
	for i := range len(hello) - 1 {
		if st, _ := sniffTLS(hello[:i+1]); st != needMore && i+1 >= 5 {
			t.Fatalf("a %d-byte prefix gave %v", i+1, st)
		}
	}
	split := refragment(hello, 100)
	if st, name := sniffTLS(split); st != found || name != "api.github.com" {
		t.Errorf("fragmented: %v %q", st, name)
	}
	if st, _ := sniffTLS(split[:len(split)-1]); st != needMore {
		t.Errorf("fragmented prefix: %v", st)
	}
	if st, name := sniffTLS(clientHello(t, "")); st != found || name != "" {
		t.Errorf("no SNI: %v %q", st, name)
	}
	if st, name := sniffTLS(clientHello(t, "10.0.0.1")); st != found || name != "" {
		t.Errorf("IP (no SNI sent): %v %q", st, name)
	}
	bad := append([]byte(nil), hello...)
	bad[5] = 2 // not a ClientHello
	if st, _ := sniffTLS(bad); st != opaque {
		t.Errorf("server hello: %v", st)
	}
}

func TestSniffHTTP(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		st   sniffState
		name string
	}{
		{"GET / HTTP/1.1\r\nHost: Example.COM:8080\r\n\r\n", found, "example.com"},
		{"GET http://a.test/x HTTP/1.1\r\nHost: b.test\r\n\r\n", found, "a.test"},
		{"GET / HTTP/1.0\r\n\r\n", found, ""},
		{"GET / HTTP/1.1\r\nHost: a.test\r\n", needMore, ""},
		{"GET / HTTP/1.1\nHost: lf.test\n\n", found, "lf.test"},
		{"GET / HTTP/1.1\nHost: lf.test\n", needMore, ""},
		{"GE", needMore, ""},
		{"SSH-2.0-OpenSSH\r\n", opaque, ""},
		{"\x00\x01binary", opaque, ""},
		{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", opaque, ""},
		{"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", found, ""},
		{"GET / HTTP/1.1\r\nHost: evil\x00.test\r\n\r\n", opaque, ""},
	}
	for _, c := range cases {
		if st, name := sniffHTTP([]byte(c.in)); st != c.st || name != c.name {
			t.Errorf("%q: %v %q, want %v %q", c.in, st, name, c.st, c.name)
		}
	}
}

func FuzzSniffTLS(f *testing.F) {
	hello := clientHello(f, "a.example.com")
	f.Add(hello)
	f.Add(refragment(hello, 50))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, name := sniffTLS(b)
		if name != "" && (st != found || normalizeName(name) != name) {
			t.Errorf("%v %q", st, name)
		}
	})
}

func TestOriginalDstLoopback(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := OriginalDst(s)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOPROTOOPT) {
		t.Skipf("no conntrack entry for a loopback connection here (nf_conntrack not active): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	// Not redirected: the original destination is the listener itself.
	if want := netip.MustParseAddrPort(ln.Addr().String()); got != want {
		t.Errorf("OriginalDst = %v, want %v", got, want)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if _, err := OriginalDst(a); err == nil {
		t.Error("OriginalDst of a pipe succeeded")
	}
}

func FuzzSniffHTTP(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"))
	f.Add([]byte("GET http://b.test/ HTTP/1.1\n\n"))
	f.Add([]byte("POST / HTTP/1.0\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, name := sniffHTTP(b)
		if name != "" && (st != found || normalizeName(name) != name) {
			t.Errorf("%v %q", st, name)
		}
		if end := headEnd(b); end > len(b) || (end >= 0 && end < 2) {
			t.Errorf("headEnd = %d for %d bytes", end, len(b))
		}
	})
}
