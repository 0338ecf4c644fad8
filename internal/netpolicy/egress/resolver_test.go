package egress

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/hutch-dev/hutch/internal/netpolicy"
)

// query sends one question to the resolver over UDP or TCP and returns
// the parsed answer.
func (w *world) query(network, name string, typ dnsmessage.Type) (dnsmessage.Message, error) {
	w.t.Helper()
	q := dnsmessage.Message{Header: dnsmessage.Header{ID: 4242, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}}}
	msg, err := q.Pack()
	if err != nil {
		w.t.Fatal(err)
	}
	addr := w.dnsUDP
	if network == "tcp" {
		addr = w.dnsTCP
		msg = append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)
	}
	c, err := net.Dial(network, addr)
	if err != nil {
		w.t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(msg); err != nil {
		w.t.Fatal(err)
	}
	buf := make([]byte, 65536)
	var n int
	if network == "tcp" {
		if _, err = io.ReadFull(c, buf[:2]); err == nil {
			n = int(binary.BigEndian.Uint16(buf[:2]))
			_, err = io.ReadFull(c, buf[:n])
		}
	} else {
		n, err = c.Read(buf)
	}
	if err != nil {
		return dnsmessage.Message{}, err
	}
	var m dnsmessage.Message
	err = m.Unpack(buf[:n])
	if err == nil && (m.ID != 4242 || !m.Response) {
		w.t.Errorf("answer header %+v", m.Header)
	}
	return m, err
}

func TestResolver(t *testing.T) {
	t.Parallel()
	w := newWorld(t, allowList("allowed.test", "*.wild.test"))
	w.names["a.wild.test"] = []netip.Addr{netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8::7")}
	for _, network := range []string{"udp", "tcp"} {
		m, err := w.query(network, "Allowed.TEST.", dnsmessage.TypeA)
		if err != nil {
			t.Fatal(err)
		}
		if m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 1 || len(m.Questions) != 1 ||
			m.Questions[0].Name.String() != "Allowed.TEST." {
			t.Fatalf("%s: %+v", network, m)
		}
		a := m.Answers[0].Body.(*dnsmessage.AResource)
		if netip.AddrFrom4(a.A) != ipAllowed || m.Answers[0].Header.TTL != defaultDNSTTL {
			t.Errorf("%s: answer %v ttl %d", network, a.A, m.Answers[0].Header.TTL)
		}
		// Only the IPv4 addresses of a wildcard-admitted name.
		if m, err = w.query(network, "a.wild.test.", dnsmessage.TypeA); err != nil || len(m.Answers) != 1 {
			t.Errorf("%s: wildcard: %+v %v", network, m, err)
		}
		// AAAA and other types of an admitted name: empty, no upstream.
		for _, typ := range []dnsmessage.Type{dnsmessage.TypeAAAA, dnsmessage.TypeTXT, dnsmessage.TypeMX, dnsmessage.TypeHTTPS} {
			m, err := w.query(network, "allowed.test.", typ)
			if err != nil || m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 0 {
				t.Errorf("%s %v: %+v %v", network, typ, m, err)
			}
		}
		// Names not admitted, whatever the type: NXDOMAIN, never asked
		// upstream (exfiltration through query names goes nowhere).
		for _, name := range []string{"evil.test.", "c2VjcmV0.exfil.evil.test.", "wild.test.", "1.0.0.127.in-addr.arpa."} {
			for _, typ := range []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA, dnsmessage.TypeTXT} {
				m, err := w.query(network, name, typ)
				if err != nil || m.RCode != dnsmessage.RCodeNameError || len(m.Answers) != 0 {
					t.Errorf("%s %s %v: %+v %v", network, name, typ, m, err)
				}
			}
		}
	}
	if n := w.lookupCount("allowed.test"); n != 2 {
		t.Errorf("allowed.test looked up %d times, want 2 (one A over UDP, one over TCP)", n)
	}
	w.lookups.Range(func(k, _ any) bool {
		if k != "allowed.test" && k != "a.wild.test" {
			t.Errorf("%v was looked up upstream", k)
		}
		return true
	})
	d := w.decision(func(d Decision) bool { return d.Proto == "dns" && d.Host == "allowed.test" })
	if !d.Allowed || d.Sandbox != "sb1" || d.IP != ipAllowed {
		t.Errorf("decision %+v", d)
	}
	// A live policy change applies to the next query.
	w.setPolicy(netpolicy.Policy{Mode: netpolicy.DenyAll})
	if m, err := w.query("udp", "allowed.test.", dnsmessage.TypeA); err != nil || m.RCode != dnsmessage.RCodeNameError {
		t.Errorf("deny-all: %+v %v", m, err)
	}
}

func TestResolverUpstreamFailureAndGarbage(t *testing.T) {
	t.Parallel()
	w := newWorld(t, allowList("missing.test"))
	if m, err := w.query("udp", "missing.test.", dnsmessage.TypeA); err != nil || m.RCode != dnsmessage.RCodeServerFailure {
		t.Errorf("%+v %v", m, err)
	}
	// Garbage and responses get no answer; the resolver keeps serving.
	c, err := net.Dial("udp", w.dnsUDP)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte{1, 2, 3})
	resp := dnsmessage.Message{Header: dnsmessage.Header{ID: 1, Response: true}}
	b, _ := resp.Pack()
	c.Write(b)
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := c.Read(make([]byte, 512)); err == nil {
		t.Errorf("got a %d-byte answer to garbage", n)
	}
	// Two questions: FORMERR.
	two := dnsmessage.Message{Header: dnsmessage.Header{ID: 2}, Questions: []dnsmessage.Question{
		{Name: dnsmessage.MustNewName("a.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET},
		{Name: dnsmessage.MustNewName("b.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}}}
	b, _ = two.Pack()
	c.Write(b)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	var m dnsmessage.Message
	if err != nil || m.Unpack(buf[:n]) != nil || m.RCode != dnsmessage.RCodeFormatError {
		t.Errorf("two questions: %+v %v", m, err)
	}
}
