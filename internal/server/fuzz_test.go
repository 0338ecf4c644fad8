package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io/fs"
	"math"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// These fuzz the request edge without a daemon. In CI they run over the
// seed corpus in testdata/fuzz; run one for real with, e.g.,
// CGO_ENABLED=0 go test -run '^$' -fuzz FuzzDecodeExecRequest -fuzztime 30s ./internal/server/

// classed fails unless err is nil or one of the classes the edge may give
// a client for bad input: never "internal" (a 500).
func classed(t *testing.T, err error, allowed ...string) {
	t.Helper()
	if err == nil {
		return
	}
	code := errdefs.Code(err)
	for _, a := range allowed {
		if code == a {
			return
		}
	}
	t.Fatalf("error %q has class %s, want one of %v", err, code, allowed)
}

// decodeBody runs decode over body with a limit, as a handler would.
func decodeBody(body []byte, limit int64, v any) error {
	r := httptest.NewRequest("POST", "/v1/x", bytes.NewReader(body))
	return decode(httptest.NewRecorder(), r, limit, v)
}

// roundTrip: what decode accepted, re-encoded, decodes to the same value.
func roundTrip[T any](t *testing.T, v *T) {
	t.Helper()
	b1, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal accepted value: %v", err)
	}
	var again T
	if err := decodeBody(b1, int64(len(b1))+1, &again); err != nil {
		t.Fatalf("re-decoding %s: %v", b1, err)
	}
	if b2, _ := json.Marshal(&again); !bytes.Equal(b1, b2) {
		t.Fatalf("round trip changed %s into %s", b1, b2)
	}
}

func addBodySeeds(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"cmd":"true"}`, ` {"cmd":"echo hi","timeout":1.5,"env":{"A":"b"}}`, `null`, `[]`, `{"cmd":`,
		`{"bogus":1}`, `{} {}`, `{}x`, ``, `{"timeout":1e400}`, `{"labels":{"a":1}}`, `{"cmd":"\ud800"}`,
		`{"id":"x","limits":{"memory_mb":64,"pids":100}}`, `{"stdin":"YQ==","stdin_encoding":"base64"}`,
	} {
		f.Add([]byte(s), uint16(64))
	}
}

func FuzzDecodeCreateSandbox(f *testing.F) {
	addBodySeeds(f)
	f.Fuzz(func(t *testing.T, body []byte, limit uint16) {
		var req api.CreateSandboxRequest
		err := decodeBody(body, int64(limit)+1, &req)
		classed(t, err, "invalid_argument", "payload_too_large")
		if err == nil {
			if len(body) > int(limit)+1 {
				t.Fatalf("accepted %d bytes over a limit of %d", len(body), int(limit)+1)
			}
			roundTrip(t, &req)
		}
	})
}

func FuzzDecodeExecRequest(f *testing.F) {
	addBodySeeds(f)
	s := New(Config{})
	f.Fuzz(func(t *testing.T, body []byte, limit uint16) {
		var req api.ExecRequest
		err := decodeBody(body, int64(limit)+1, &req)
		classed(t, err, "invalid_argument", "payload_too_large")
		if err != nil {
			return
		}
		roundTrip(t, &req)
		// What decodes is then validated: a class, never a panic, and
		// what passes is something a backend can run.
		ereq, stdin, err := s.execRequest(req)
		classed(t, err, "invalid_argument", "payload_too_large")
		if err != nil {
			return
		}
		if ereq.Cmd == "" || len(ereq.Cmd) > s.lim.MaxCmdBytes || bytes.IndexByte([]byte(ereq.Cmd), 0) >= 0 {
			t.Fatalf("accepted cmd %q", ereq.Cmd)
		}
		if ereq.Timeout <= 0 || ereq.Timeout > s.lim.MaxTimeout {
			t.Fatalf("accepted timeout %v from %v", ereq.Timeout, req.Timeout)
		}
		if int64(len(stdin)) > s.lim.MaxStdinBytes || ereq.Stdin != (stdin != nil) {
			t.Fatalf("stdin %d bytes, Stdin %v", len(stdin), ereq.Stdin)
		}
	})
}

func FuzzParseMode(f *testing.F) {
	for _, s := range []string{"", "0644", "755", "4755", "07777", "10000", "999", "0x1ff", "-1", "+644", "rwx", " 644", "0o644", "00000000000000644"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseMode(s, 0o600)
		classed(t, err, "invalid_argument")
		if err != nil {
			return
		}
		if m&^(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
			t.Fatalf("mode %q gave type bits: %v", s, m)
		}
		// What toAPIFile prints parses back to the same mode.
		printed := toAPIFile(fileInfoWithMode(m)).Mode
		if back, err := parseMode(printed, 0); err != nil || back != m {
			t.Fatalf("%q -> %v -> %q -> %v (%v)", s, m, printed, back, err)
		}
	})
}

func FuzzParseSignal(f *testing.F) {
	for _, s := range []string{"TERM", "SIGTERM", "sigkill", "9", "0", "65", "-1", "", "SIG", "SIGRTMIN", "99999999999999999999", "+9", "0x9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sig, err := parseSignal(s)
		classed(t, err, "invalid_argument")
		if err == nil && (sig < 1 || sig > 64) {
			t.Fatalf("signal %q parsed as %d", s, sig)
		}
	})
}

func FuzzDecodeStdin(f *testing.F) {
	for _, s := range []struct{ in, enc string }{
		{"", ""}, {"hello", "utf8"}, {"aGVsbG8=", "base64"}, {"aGVsbG8", "base64"}, {"!!", "base64"},
		{"aGVs\nbG8=", "base64"}, {"x", "hex"}, {"\x00\xff", ""},
	} {
		f.Add(s.in, s.enc, uint16(8))
	}
	f.Fuzz(func(t *testing.T, in, enc string, max uint16) {
		data, err := decodeStdin(in, enc, int64(max))
		classed(t, err, "invalid_argument", "payload_too_large")
		if err != nil {
			return
		}
		if len(data) > int(max) || (in == "") != (data == nil) {
			t.Fatalf("decodeStdin(%q, %q, %d) = %d bytes", in, enc, max, len(data))
		}
		if enc == "base64" {
			if want, _ := base64.StdEncoding.DecodeString(in); !bytes.Equal(data, want) {
				t.Fatalf("base64 %q decoded as %q", in, data)
			}
		} else if string(data) != in {
			t.Fatalf("utf8 %q came back as %q", in, data)
		}
	})
}

func FuzzSeconds(f *testing.F) {
	for _, v := range []float64{0, 0.001, 1, 300, 3600, 3601, -1, 1e300, math.Inf(1), math.NaN(), math.MaxInt64 / 1e9} {
		f.Add(v)
	}
	s := New(Config{})
	f.Fuzz(func(t *testing.T, sec float64) {
		d, err := seconds(sec)
		classed(t, err, "invalid_argument")
		if err == nil && (d < 0 || sec < 0 || math.IsNaN(sec)) {
			t.Fatalf("seconds(%v) = %v", sec, d)
		}
		d, err = s.timeout(sec)
		classed(t, err, "invalid_argument")
		if err == nil && (d <= 0 || d > s.lim.MaxTimeout) {
			t.Fatalf("timeout(%v) = %v", sec, d)
		}
	})
}

// TestDecodeErrors pins the classes of the body errors the fuzzers only
// require to be classed.
func TestDecodeErrors(t *testing.T) {
	for body, want := range map[string]string{
		`{"cmd":"x"}`:   "",
		` {"cmd":"x"} `: "",
		`null`:          "invalid_argument",
		`[]`:            "invalid_argument",
		`{"cmd":1}`:     "invalid_argument",
		`{"nope":1}`:    "invalid_argument",
		`{} {}`:         "invalid_argument",
		``:              "invalid_argument",
		`{"cmd":"` + string(bytes.Repeat([]byte("x"), 100)) + `"}`: "payload_too_large",
	} {
		var req api.ExecRequest
		err := decodeBody([]byte(body), 64, &req)
		if got := codeOf(err); got != want {
			t.Errorf("decode %.20q: %v (%s), want %q", body, err, got, want)
		}
	}
}

func codeOf(err error) string {
	if err == nil {
		return ""
	}
	return errdefs.Code(err)
}

func fileInfoWithMode(m fs.FileMode) backend.FileInfo {
	return backend.FileInfo{Name: "f", Path: "/f", Mode: m, ModTime: time.Unix(0, 0)}
}
