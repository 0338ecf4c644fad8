package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Key is an API key. Each key is a tenant (or one of a tenant's keys); the
// secret itself is never stored, only its SHA-256 and a display prefix.
type Key struct {
	ID       string     `json:"id"`
	Name     string     `json:"name"`
	Tenant   string     `json:"tenant"`
	Prefix   string     `json:"prefix"`
	Created  time.Time  `json:"created"`
	LastUsed *time.Time `json:"last_used,omitempty"`
	Revoked  *time.Time `json:"revoked,omitempty"`
	Expires  *time.Time `json:"expires,omitempty"`
}

const (
	secretPrefix  = "hutch_"
	secretRandLen = 40 // base62: ~238 bits
	prefixLen     = 12 // "hutch_" + 6 characters, shown in listings
	keyIDPrefix   = "key_"
	keyIDRandLen  = 12
	// lastUsedEvery throttles the last_used write so that authentication,
	// which runs on every request, is a read almost always.
	lastUsedEvery = time.Minute
	maxNameLen    = 256
)

const (
	base62   = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	base32lc = "abcdefghijklmnopqrstuvwxyz234567"
)

const (
	keyCols      = `id, name, tenant, prefix, created, last_used, revoked, expires`
	keyByHashSQL = `SELECT ` + keyCols + ` FROM api_keys WHERE hash = ?`
)

// CreateKey makes a key and returns it with its secret, which is not
// recoverable afterwards. tenant defaults to the key's ID.
func (s *Store) CreateKey(ctx context.Context, name, tenant string, expires *time.Time) (Key, string, error) {
	now := s.now().UTC()
	if err := checkKeyArgs(name, tenant, expires, now); err != nil {
		return Key{}, "", err
	}
	var k Key
	var secret string
	err := s.write(ctx, func(tx *sql.Tx) error {
		var err error
		k, secret, err = newUniqueKey(ctx, tx)
		if err != nil {
			return err
		}
		k.Name, k.Tenant, k.Created, k.Expires = name, tenant, now, utcPtr(expires)
		if k.Tenant == "" {
			k.Tenant = k.ID
		}
		h := sha256.Sum256([]byte(secret))
		_, err = tx.ExecContext(ctx, `INSERT INTO api_keys (id, name, tenant, prefix, hash, created, expires)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, k.ID, k.Name, k.Tenant, k.Prefix, h[:], ts(k.Created), nullTS(k.Expires))
		if err != nil {
			return fmt.Errorf("store: create key: %w", classify(err))
		}
		return nil
	})
	if err != nil {
		return Key{}, "", err
	}
	return k, secret, nil
}

func checkKeyArgs(name, tenant string, expires *time.Time, now time.Time) error {
	if len(name) > maxNameLen || len(tenant) > maxNameLen {
		return fmt.Errorf("store: key name or tenant longer than %d bytes: %w", maxNameLen, errdefs.ErrInvalidArgument)
	}
	if expires != nil && !expires.After(now) {
		return fmt.Errorf("store: key expiry %s is not in the future: %w", expires.UTC().Format(time.RFC3339), errdefs.ErrInvalidArgument)
	}
	return nil
}

// newUniqueKey draws an ID and a secret whose ID and display prefix are both
// unused. A 6-character prefix collides rarely but not never; redrawing keeps
// RevokeKey(prefix) unambiguous. The check and the insert share the writer
// transaction, so nothing can slip in between.
func newUniqueKey(ctx context.Context, tx *sql.Tx) (Key, string, error) {
	for range 8 {
		secret := secretPrefix + randString(base62, secretRandLen)
		k := Key{ID: keyIDPrefix + randString(base32lc, keyIDRandLen), Prefix: secret[:prefixLen]}
		var taken bool
		err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM api_keys WHERE id = ?1 OR prefix = ?2)`,
			k.ID, k.Prefix).Scan(&taken)
		if err != nil {
			return Key{}, "", fmt.Errorf("store: create key: %w", classify(err))
		}
		if !taken {
			return k, secret, nil
		}
	}
	return Key{}, "", fmt.Errorf("store: create key: no unused key prefix after 8 draws: %w", errdefs.ErrResourceExhausted)
}

// ListKeys returns every key, newest first.
func (s *Store) ListKeys(ctx context.Context) ([]Key, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+keyCols+` FROM api_keys ORDER BY created DESC, id DESC`)
	if err != nil {
		return nil, fmt.Errorf("store: list keys: %w", classify(err))
	}
	defer rows.Close()
	var keys []Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list keys: %w", classify(err))
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list keys: %w", classify(err))
	}
	return keys, nil
}

// RevokeKey revokes the key with this ID or display prefix. Revoking a
// revoked key succeeds and keeps the first revocation time.
func (s *Store) RevokeKey(ctx context.Context, idOrPrefix string) (Key, error) {
	if idOrPrefix == "" {
		return Key{}, fmt.Errorf("store: revoke key: empty id: %w", errdefs.ErrInvalidArgument)
	}
	// IDs start "key_" and prefixes "hutch_", and both are unique, so at
	// most one row matches.
	row := s.w.QueryRowContext(ctx, `UPDATE api_keys SET revoked = COALESCE(revoked, ?1)
		WHERE id = ?2 OR prefix = ?2 RETURNING `+keyCols, ts(s.now()), idOrPrefix)
	k, err := scanKey(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, fmt.Errorf("store: key %q: %w", idOrPrefix, errdefs.ErrNotFound)
	}
	if err != nil {
		return Key{}, fmt.Errorf("store: revoke key: %w", classify(err))
	}
	return k, nil
}

// Authenticate returns the live key whose secret this is. Unknown, revoked
// and expired keys are all ErrUnauthenticated. Plain SHA-256 (not a slow
// password hash) is right here: the secret is ~238 random bits, so there is
// nothing to brute-force, and this runs on every request.
func (s *Store) Authenticate(ctx context.Context, secret string) (Key, error) {
	if !wellFormedSecret(secret) {
		return Key{}, fmt.Errorf("store: malformed api key: %w", errdefs.ErrUnauthenticated)
	}
	h := sha256.Sum256([]byte(secret))
	k, err := scanKey(s.keyByHash.QueryRowContext(ctx, h[:]))
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, fmt.Errorf("store: unknown api key: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		return Key{}, fmt.Errorf("store: authenticate: %w", classify(err))
	}
	now := s.now().UTC()
	if k.Revoked != nil {
		return Key{}, fmt.Errorf("store: api key %s was revoked at %s: %w", k.ID, k.Revoked.Format(time.RFC3339), errdefs.ErrUnauthenticated)
	}
	if k.Expires != nil && !now.Before(*k.Expires) {
		return Key{}, fmt.Errorf("store: api key %s expired at %s: %w", k.ID, k.Expires.Format(time.RFC3339), errdefs.ErrUnauthenticated)
	}
	if k.LastUsed == nil || now.Sub(*k.LastUsed) >= lastUsedEvery {
		if err := s.touchKey(ctx, k.ID, now); err != nil {
			return Key{}, err
		}
		k.LastUsed = &now
	}
	return k, nil
}

// touchKey records a use. The condition repeats the throttle in SQL so that
// concurrent requests racing past the read do not each write a new time.
func (s *Store) touchKey(ctx context.Context, id string, now time.Time) error {
	_, err := s.w.ExecContext(ctx, `UPDATE api_keys SET last_used = ?1
		WHERE id = ?2 AND (last_used IS NULL OR last_used <= ?3)`, ts(now), id, ts(now.Add(-lastUsedEvery)))
	if err != nil {
		return fmt.Errorf("store: record key use: %w", classify(err))
	}
	return nil
}

// wellFormedSecret rejects garbage before it costs a hash and a query.
func wellFormedSecret(s string) bool {
	if len(s) != len(secretPrefix)+secretRandLen || !strings.HasPrefix(s, secretPrefix) {
		return false
	}
	for i := len(secretPrefix); i < len(s); i++ {
		if strings.IndexByte(base62, s[i]) < 0 {
			return false
		}
	}
	return true
}

type scanner interface{ Scan(dest ...any) error }

func scanKey(row scanner) (Key, error) {
	var k Key
	var created int64
	var lastUsed, revoked, expires sql.NullInt64
	err := row.Scan(&k.ID, &k.Name, &k.Tenant, &k.Prefix, &created, &lastUsed, &revoked, &expires)
	if err != nil {
		return Key{}, err
	}
	k.Created = fromTS(created)
	k.LastUsed, k.Revoked, k.Expires = fromNullTS(lastUsed), fromNullTS(revoked), fromNullTS(expires)
	return k, nil
}

// randString returns n characters drawn uniformly from alphabet (at most 256
// characters) by rejection sampling, so that no character is more likely.
func randString(alphabet string, n int) string {
	limit := 256 - 256%len(alphabet) // bytes >= limit would bias the modulo
	out := make([]byte, 0, n)
	buf := make([]byte, n+n/2)
	for len(out) < n {
		rand.Read(buf) // never fails (it crashes the program instead)
		for _, b := range buf {
			if int(b) < limit && len(out) < n {
				out = append(out, alphabet[int(b)%len(alphabet)])
			}
		}
	}
	return string(out)
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	// Round-trip through the storage encoding so the returned key equals
	// what a later read returns.
	u := fromTS(ts(*t))
	return &u
}
