package server

import (
	"encoding/json"
	"net/http"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/netpolicy"
)

// GetNetwork implements api.ServerInterface.
func (s *Server) GetNetwork(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	p, err := s.mgr.NetworkPolicy(r.Context(), s.scope(r), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPIPolicy(p))
}

// SetNetwork implements api.ServerInterface.
func (s *Server) SetNetwork(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.NetworkPolicy
	if err := decode(w, r, s.lim.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if _, err := s.mgr.SetNetwork(r.Context(), s.scope(r), id, fromAPIPolicy(req)); err != nil {
		s.fail(w, r, err)
		return
	}
	s.GetNetwork(w, r, id)
}

// NetworkEvents implements api.ServerInterface.
func (s *Server) NetworkEvents(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	evs, err := s.mgr.NetworkEvents(r.Context(), s.scope(r), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := api.NetworkEventList{Events: make([]api.NetworkEvent, 0, len(evs))}
	for _, e := range evs {
		out.Events = append(out.Events, api.NetworkEvent{Time: e.Time, Proto: e.Proto, Host: e.Host, Ip: e.IP,
			Port: e.Port, Allowed: e.Allowed, Reason: e.Reason, BytesUp: e.BytesUp, BytesDown: e.BytesDown})
	}
	writeJSON(w, http.StatusOK, out)
}

// The API's policy and netpolicy.Policy are the same JSON document; going
// through JSON keeps the two definitions from drifting apart silently.
func fromAPIPolicy(p api.NetworkPolicy) netpolicy.Policy {
	var out netpolicy.Policy
	b, _ := json.Marshal(p)
	_ = json.Unmarshal(b, &out)
	return out
}

func toAPIPolicy(p netpolicy.Policy) api.NetworkPolicy {
	var out api.NetworkPolicy
	b, _ := json.Marshal(p)
	_ = json.Unmarshal(b, &out)
	return out
}
