package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

var (
	secretRE = regexp.MustCompile(`^hutch_[0-9A-Za-z]{40}$`)
	keyIDRE  = regexp.MustCompile(`^key_[a-z2-7]{12}$`)
)

func TestCreateAndAuthenticate(t *testing.T) {
	s, _ := openTest(t)
	clk := newClock(s)
	ctx := context.Background()
	k, secret, err := s.CreateKey(ctx, "laptop", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !secretRE.MatchString(secret) || !keyIDRE.MatchString(k.ID) {
		t.Fatalf("secret %q or id %q malformed", secret, k.ID)
	}
	if k.Prefix != secret[:12] || k.Tenant != k.ID || k.Name != "laptop" || !k.Created.Equal(clk.now()) {
		t.Fatalf("key = %+v", k)
	}
	if k.LastUsed != nil || k.Revoked != nil || k.Expires != nil {
		t.Fatalf("new key has times set: %+v", k)
	}
	got, err := s.Authenticate(ctx, secret)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != k.ID || got.LastUsed == nil || !got.LastUsed.Equal(clk.now()) {
		t.Fatalf("Authenticate = %+v", got)
	}
	k2, _, err := s.CreateKey(ctx, "team", "acme", nil)
	if err != nil || k2.Tenant != "acme" || k2.ID == k.ID {
		t.Fatalf("CreateKey with tenant = %+v, %v", k2, err)
	}
}

func TestAuthenticateRejects(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	_, secret, err := s.CreateKey(ctx, "x", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	unknown := secretPrefix + randString(base62, secretRandLen) // well-formed, never issued
	for _, bad := range []string{"", "hutch_", secret[:45], secret + "x", unknown,
		"hutch_" + strings.Repeat("!", 40), strings.Replace(secret, "hutch_", "hutcz_", 1)} {
		_, err := s.Authenticate(ctx, bad)
		wantErr(t, err, errdefs.ErrUnauthenticated)
		if bad != "" && strings.Contains(err.Error(), bad) {
			t.Errorf("the error repeats the secret: %v", err)
		}
	}
}

func TestRevokeKey(t *testing.T) {
	s, _ := openTest(t)
	clk := newClock(s)
	ctx := context.Background()
	k, secret := must2(t)(s.CreateKey(ctx, "a", "", nil))
	other, otherSecret := must2(t)(s.CreateKey(ctx, "b", "", nil))

	r, err := s.RevokeKey(ctx, k.Prefix)
	if err != nil || r.ID != k.ID || r.Revoked == nil || !r.Revoked.Equal(clk.now()) {
		t.Fatalf("RevokeKey(prefix) = %+v, %v", r, err)
	}
	first := *r.Revoked
	clk.advance(time.Hour)
	r, err = s.RevokeKey(ctx, k.ID) // again, by ID: fine, and keeps the first time
	if err != nil || !r.Revoked.Equal(first) {
		t.Fatalf("second RevokeKey = %+v, %v; want revoked at %v", r, err, first)
	}
	_, err = s.Authenticate(ctx, secret)
	wantErr(t, err, errdefs.ErrUnauthenticated)
	if !strings.Contains(err.Error(), "revoked") {
		t.Errorf("the error does not say revoked: %v", err)
	}
	if _, err := s.Authenticate(ctx, otherSecret); err != nil {
		t.Fatalf("revoking %s broke %s: %v", k.ID, other.ID, err)
	}
	_, err = s.RevokeKey(ctx, "key_nonexistent")
	wantErr(t, err, errdefs.ErrNotFound)
	_, err = s.RevokeKey(ctx, "hutch_")
	wantErr(t, err, errdefs.ErrNotFound)
	_, err = s.RevokeKey(ctx, "")
	wantErr(t, err, errdefs.ErrInvalidArgument)
}

func TestKeyExpiry(t *testing.T) {
	s, _ := openTest(t)
	clk := newClock(s)
	ctx := context.Background()
	exp := clk.now().Add(time.Hour)
	k, secret := must2(t)(s.CreateKey(ctx, "temp", "", &exp))
	if k.Expires == nil || !k.Expires.Equal(exp) {
		t.Fatalf("Expires = %v, want %v", k.Expires, exp)
	}
	clk.advance(59 * time.Minute)
	if _, err := s.Authenticate(ctx, secret); err != nil {
		t.Fatalf("before expiry: %v", err)
	}
	clk.advance(time.Minute)
	_, err := s.Authenticate(ctx, secret)
	wantErr(t, err, errdefs.ErrUnauthenticated)
	if !strings.Contains(err.Error(), "expired") {
		t.Errorf("the error does not say expired: %v", err)
	}
	past := clk.now().Add(-time.Second)
	_, _, err = s.CreateKey(ctx, "late", "", &past)
	wantErr(t, err, errdefs.ErrInvalidArgument)
}

// last_used is written at most once a minute per key; in between,
// Authenticate is a pure read.
func TestLastUsedThrottle(t *testing.T) {
	s, _ := openTest(t)
	clk := newClock(s)
	ctx := context.Background()
	k, secret := must2(t)(s.CreateKey(ctx, "a", "", nil))
	stored := func() time.Time {
		for _, l := range must[[]Key](t)(s.ListKeys(ctx)) {
			if l.ID == k.ID && l.LastUsed != nil {
				return *l.LastUsed
			}
		}
		return time.Time{}
	}
	t0 := clk.now()
	must[Key](t)(s.Authenticate(ctx, secret))
	clk.advance(59 * time.Second)
	got := must[Key](t)(s.Authenticate(ctx, secret))
	if !stored().Equal(t0) || !got.LastUsed.Equal(t0) {
		t.Fatalf("last_used moved within a minute: stored %v, returned %v, want %v", stored(), got.LastUsed, t0)
	}
	clk.advance(time.Second)
	must[Key](t)(s.Authenticate(ctx, secret))
	if want := t0.Add(time.Minute); !stored().Equal(want) {
		t.Fatalf("last_used = %v, want %v", stored(), want)
	}
}

func TestListKeysNewestFirst(t *testing.T) {
	s, _ := openTest(t)
	clk := newClock(s)
	ctx := context.Background()
	var ids []string
	for _, name := range []string{"one", "two", "three"} {
		k, _ := must2(t)(s.CreateKey(ctx, name, "", nil))
		ids = append([]string{k.ID}, ids...)
		clk.advance(time.Second)
	}
	keys := must[[]Key](t)(s.ListKeys(ctx))
	if len(keys) != 3 {
		t.Fatalf("ListKeys returned %d keys", len(keys))
	}
	for i, k := range keys {
		if k.ID != ids[i] {
			t.Fatalf("ListKeys order: got %s at %d, want %s", k.ID, i, ids[i])
		}
	}
}

// Only the prefix and the SHA-256 of the secret reach the disk.
func TestSecretNotStored(t *testing.T) {
	s, path := openTest(t)
	ctx := context.Background()
	var secrets []string
	for range 5 {
		_, secret := must2(t)(s.CreateKey(ctx, "k", "", nil))
		secrets = append(secrets, secret)
	}
	check := func() {
		for _, p := range []string{path, path + "-wal"} {
			data, err := os.ReadFile(p)
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			for _, sec := range secrets {
				// The random part after the displayed prefix is what
				// must never be stored, in any form we could grep.
				if bytes.Contains(data, []byte(sec[12:])) {
					t.Fatalf("%s contains a secret", p)
				}
			}
		}
	}
	check() // in the WAL, before any checkpoint
	for _, sec := range secrets {
		var prefix string
		var hash []byte
		h := sha256.Sum256([]byte(sec))
		err := s.r.QueryRow(`SELECT prefix, hash FROM api_keys WHERE prefix = ?`, sec[:12]).Scan(&prefix, &hash)
		if err != nil || !bytes.Equal(hash, h[:]) {
			t.Fatalf("stored hash for %s = %x, %v; want %x", prefix, hash, err, h)
		}
	}
	if _, err := s.w.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	check() // in the main file
}

func TestRandString(t *testing.T) {
	seen := map[byte]int{}
	for range 2000 {
		for _, c := range []byte(randString(base62, 40)) {
			seen[c]++
		}
	}
	if len(seen) != 62 {
		t.Fatalf("randString used %d distinct characters, want 62", len(seen))
	}
	for c, n := range seen {
		// 80000 draws over 62 characters: ~1290 each.
		if n < 1000 || n > 1600 {
			t.Errorf("character %q drawn %d times", c, n)
		}
	}
}

func must2(t testing.TB) func(Key, string, error) (Key, string) {
	return func(k Key, s string, err error) (Key, string) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return k, s
	}
}
