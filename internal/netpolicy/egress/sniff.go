package egress

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"net/http"
)

// sniff results.
type sniffState int

const (
	needMore sniffState = iota // the bytes so far are a prefix of something we can read
	found                      // a name was read (it may still be "": no SNI, no Host)
	opaque                     // not TLS, not HTTP/1.x, or malformed: no name
)

const (
	recordHeaderLen  = 5
	handshakeTypeCH  = 1
	recordTypeHS     = 0x16
	extServerName    = 0
	sniHostNameType  = 0
	maxPeek          = 32 << 10 // a ClientHello with post-quantum key shares is ~2 KB; 32 KB is generous
	maxClientHelloHS = maxPeek
	maxHelloRecords  = 16
)

// sniffTLS reads the SNI from a ClientHello at the start of b, which may
// be spread over several TLS records. It never reads beyond b, and copies
// nothing in the common case of a ClientHello in one record.
func sniffTLS(b []byte) (sniffState, string) {
	var hs []byte // the handshake bytes gathered so far
	need := -1    // the handshake message's full length, once known
	for records := 0; len(b) > 0; records++ {
		if records == maxHelloRecords {
			return opaque, "" // real clients use one or two; tiny records only cost us
		}
		if len(b) < recordHeaderLen {
			return needMore, ""
		}
		if b[0] != recordTypeHS || b[1] != 3 {
			return opaque, ""
		}
		n := int(binary.BigEndian.Uint16(b[3:5]))
		if n == 0 || n > 1<<14 {
			return opaque, ""
		}
		if len(b) < recordHeaderLen+n {
			return needMore, "" // records are atomic: wait for all of it
		}
		frag := b[recordHeaderLen : recordHeaderLen+n]
		b = b[recordHeaderLen+n:]
		if hs == nil {
			hs = frag // usually the whole ClientHello: no copy
		} else {
			if len(hs)+n > maxClientHelloHS {
				return opaque, ""
			}
			hs = append(hs[:len(hs):len(hs)], frag...)
		}
		if need < 0 && len(hs) >= 4 {
			if hs[0] != handshakeTypeCH {
				return opaque, ""
			}
			need = 4 + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]))
			if need > maxClientHelloHS {
				return opaque, ""
			}
		}
		if need >= 0 && len(hs) >= need {
			name, ok := parseClientHello(hs[4:need])
			if !ok {
				return opaque, ""
			}
			return found, name
		}
	}
	return needMore, ""
}

// parseClientHello returns the host_name of the server_name extension of
// a ClientHello body ("" if there is none), or ok=false if the body is
// malformed.
func parseClientHello(body []byte) (name string, ok bool) {
	r := reader(body)
	var sid, suites, comp, exts reader
	if !r.skip(2+32) || !r.vec8(&sid) || !r.vec16(&suites) || !r.vec8(&comp) {
		return "", false
	}
	if len(r) == 0 {
		return "", true // no extensions at all: no SNI
	}
	if !r.vec16(&exts) || len(r) != 0 {
		return "", false
	}
	for len(exts) > 0 {
		var typ uint16
		var data reader
		if !exts.u16(&typ) || !exts.vec16(&data) {
			return "", false
		}
		if typ != extServerName {
			continue
		}
		var list reader
		if !data.vec16(&list) || len(data) != 0 {
			return "", false
		}
		for len(list) > 0 {
			var nt uint8
			var host reader
			if !list.u8(&nt) || !list.vec16(&host) {
				return "", false
			}
			if nt == sniHostNameType {
				n := normalizeName(string(host))
				if n == "" {
					return "", false // an SNI we cannot read is not "no SNI"
				}
				return n, true
			}
		}
		return "", false
	}
	return "", true
}

// reader is a bounds-checked cursor over a byte slice.
type reader []byte

func (r *reader) skip(n int) bool {
	if len(*r) < n {
		return false
	}
	*r = (*r)[n:]
	return true
}

func (r *reader) u8(v *uint8) bool {
	if len(*r) < 1 {
		return false
	}
	*v = (*r)[0]
	*r = (*r)[1:]
	return true
}

func (r *reader) u16(v *uint16) bool {
	if len(*r) < 2 {
		return false
	}
	*v = binary.BigEndian.Uint16(*r)
	*r = (*r)[2:]
	return true
}

func (r *reader) vec8(out *reader) bool {
	var n uint8
	if !r.u8(&n) || len(*r) < int(n) {
		return false
	}
	*out, *r = (*r)[:n], (*r)[n:]
	return true
}

func (r *reader) vec16(out *reader) bool {
	var n uint16
	if !r.u16(&n) || len(*r) < int(n) {
		return false
	}
	*out, *r = (*r)[:n], (*r)[n:]
	return true
}

// looksHTTP reports whether b can be the start of an HTTP/1.x request: a
// method token of capital letters followed by a space.
func looksHTTP(b []byte) sniffState {
	for i, c := range b {
		switch {
		case c >= 'A' && c <= 'Z' && i < 16:
		case c == ' ' && i > 0:
			return found
		default:
			return opaque
		}
	}
	return needMore
}

// sniffHTTP reads the name of an HTTP/1.x request head at the start of b:
// the host of an absolute-form target, else the Host header, as Go's
// server decides it (the intercepting path re-reads every request with
// that server, so both agree). The whole head must be in b.
func sniffHTTP(b []byte) (sniffState, string) {
	if st := looksHTTP(b); st != found {
		return st, ""
	}
	end := headEnd(b)
	if end < 0 {
		if len(b) >= maxPeek {
			return opaque, ""
		}
		return needMore, ""
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b[:end])))
	if err != nil || req.ProtoMajor != 1 {
		return opaque, ""
	}
	return found, normalizeName(req.Host)
}

// headEnd returns the length of the request head in b (through its empty
// line), or -1. Like Go's server it takes bare LF line ends too.
func headEnd(b []byte) int {
	for i := bytes.IndexByte(b, '\n'); i >= 0; {
		rest := b[i+1:]
		switch {
		case len(rest) > 0 && rest[0] == '\n':
			return i + 2
		case len(rest) > 1 && rest[0] == '\r' && rest[1] == '\n':
			return i + 3
		}
		j := bytes.IndexByte(rest, '\n')
		if j < 0 {
			return -1
		}
		i += 1 + j
	}
	return -1
}
