package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// FuzzPageToken feeds arbitrary client tokens to the decoder and to
// ListSandboxes: a bad token is ErrInvalidArgument, a good one lists, and
// nothing panics. Seeds live in testdata/fuzz/FuzzPageToken.
func FuzzPageToken(f *testing.F) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(f.TempDir(), "fuzz.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	for _, id := range []string{"a", "b", "c"} {
		if _, err := s.InsertSandbox(ctx, Sandbox{ID: id, State: "running"}); err != nil {
			f.Fatal(err)
		}
	}
	f.Add(encodePageToken(0, "a"))
	f.Add(encodePageToken(-1, "\x00\xff"))
	f.Add("")
	f.Add("not/base64!")
	f.Fuzz(func(t *testing.T, tok string) {
		created, id, err := decodePageToken(tok)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("decode error %v is not invalid argument", err)
			}
			return
		}
		c2, id2, err := decodePageToken(encodePageToken(created, id))
		if err != nil || c2 != created || id2 != id {
			t.Fatalf("re-encoding (%d, %q) gave (%d, %q), %v", created, id, c2, id2, err)
		}
		if tok == "" {
			return // "" means the first page
		}
		if _, _, err := s.ListSandboxes(ctx, ListFilter{PageToken: tok, Limit: 2}); err != nil {
			t.Fatalf("ListSandboxes with a valid token: %v", err)
		}
	})
}
