package server

import (
	"net/http"
	"time"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/store"
)

// admin allows key management from the trusted local socket only.
func (s *Server) admin(r *http.Request) error {
	if !tenantOf(r.Context()).Trusted {
		return errdefs.New(errdefs.ErrPermissionDenied, "API keys are managed over the daemon's local socket only")
	}
	return nil
}

func toAPIKey(k store.Key) api.Key {
	return api.Key{Id: k.ID, Name: k.Name, Tenant: k.Tenant, Prefix: k.Prefix, CreatedAt: k.Created,
		LastUsedAt: k.LastUsed, RevokedAt: k.Revoked, ExpiresAt: k.Expires}
}

// CreateKey implements api.ServerInterface.
func (s *Server) CreateKey(w http.ResponseWriter, r *http.Request) {
	var req api.CreateKeyRequest
	err := s.admin(r)
	if err == nil {
		err = decode(w, r, s.lim.MaxBodyBytes, &req)
	}
	if err == nil && req.Name == "" {
		err = invalid("name is empty")
	}
	if err == nil && req.ExpiresIn < 0 {
		err = invalid("expires_in %d: want seconds > 0", req.ExpiresIn)
	}
	var k store.Key
	var secret string
	if err == nil {
		var exp *time.Time
		if req.ExpiresIn > 0 {
			t := time.Now().Add(time.Duration(req.ExpiresIn) * time.Second).UTC()
			exp = &t
		}
		k, secret, err = s.st.CreateKey(r.Context(), req.Name, req.Tenant, exp)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, api.CreatedKey{Key: toAPIKey(k), Secret: secret})
}

// ListKeys implements api.ServerInterface.
func (s *Server) ListKeys(w http.ResponseWriter, r *http.Request) {
	err := s.admin(r)
	var ks []store.Key
	if err == nil {
		ks, err = s.st.ListKeys(r.Context())
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := api.KeyList{Keys: make([]api.Key, 0, len(ks))}
	for _, k := range ks {
		out.Keys = append(out.Keys, toAPIKey(k))
	}
	writeJSON(w, http.StatusOK, out)
}

// RevokeKey implements api.ServerInterface.
func (s *Server) RevokeKey(w http.ResponseWriter, r *http.Request, key string) {
	err := s.admin(r)
	var k store.Key
	if err == nil {
		k, err = s.st.RevokeKey(r.Context(), key)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPIKey(k))
}
