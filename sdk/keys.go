package hutch

import (
	"context"
	"time"

	"github.com/hutch-dev/hutch/api"
)

// KeyOptions adjust CreateKey.
type KeyOptions struct {
	// Tenant is the tenant the key acts for; by default, its own id. Keys
	// of one tenant share its sandboxes.
	Tenant string
	// ExpiresIn makes the key stop working after this long (whole seconds,
	// rounded up); 0 = never.
	ExpiresIn time.Duration
}

// CreateKey creates an API key; the secret in the result is shown only
// this once. Keys are managed over the daemon's socket only.
func (c *Client) CreateKey(ctx context.Context, name string, o KeyOptions) (*CreatedKey, error) {
	req := api.CreateKeyRequest{Name: name, Tenant: o.Tenant, ExpiresIn: ceilSeconds(o.ExpiresIn)}
	r, err := c.api.CreateKeyWithResponse(ctx, req)
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	k, err := must(r.JSON201)
	if err != nil {
		return nil, err
	}
	return &CreatedKey{Key: *fromAPIKey(k.Key), Secret: k.Secret}, nil
}

// ListKeys lists every key, never with its secret.
func (c *Client) ListKeys(ctx context.Context) ([]Key, error) {
	r, err := c.api.ListKeysWithResponse(ctx)
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	list, err := must(r.JSON200)
	if err != nil {
		return nil, err
	}
	out := make([]Key, 0, len(list.Keys))
	for _, k := range list.Keys {
		out = append(out, *fromAPIKey(k))
	}
	return out, nil
}

// RevokeKey revokes a key, by id or display prefix, and returns it.
func (c *Client) RevokeKey(ctx context.Context, idOrPrefix string) (*Key, error) {
	r, err := c.api.RevokeKeyWithResponse(ctx, idOrPrefix)
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	k, err := must(r.JSON200)
	if err != nil {
		return nil, err
	}
	return fromAPIKey(*k), nil
}
