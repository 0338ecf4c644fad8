package e2b

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"

	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/netpolicy"
)

// networkConfig is E2B's network object (create's `network`, and the body
// of PUT /sandboxes/{id}/network with allow_internet_access beside it).
type networkConfig struct {
	AllowOut []string                 `json:"allowOut"`
	DenyOut  []string                 `json:"denyOut"`
	Rules    map[string][]networkRule `json:"rules"`
	// What hutch has no counterpart for is refused, not ignored.
	EgressProxy json.RawMessage `json:"egressProxy"`
	HTTPSPorts  []int           `json:"httpsPorts"`
	// allowPublicTraffic and maskRequestHost concern E2B's public sandbox
	// URLs; hutch's exposed ports have their own access setting.
	AllowPublicTraffic *bool  `json:"allowPublicTraffic"`
	MaskRequestHost    string `json:"maskRequestHost"`
}

type networkRule struct {
	Transform *struct {
		Headers map[string]string `json:"headers"`
	} `json:"transform"`
}

// allTraffic is E2B's "everything" selector.
const allTraffic = "0.0.0.0/0"

// parseNetwork reads create's network object (absent: the zero config).
func parseNetwork(raw json.RawMessage) (networkConfig, error) {
	var cfg networkConfig
	if !isNull(raw) {
		if err := json.Unmarshal(raw, &cfg); err != nil {
			return cfg, errdefs.New(errdefs.ErrInvalidArgument, "network: %v", err)
		}
	}
	return cfg, nil
}

// public reports whether the sandbox's ports are public: E2B's are unless
// allowPublicTraffic is false.
func (cfg networkConfig) public() bool {
	return cfg.AllowPublicTraffic == nil || *cfg.AllowPublicTraffic
}

// e2bPolicy maps E2B's egress settings onto a hutch policy. E2B allows
// the internet unless told otherwise; allow_internet_access=false is
// denyOut 0.0.0.0/0; allowOut entries (names, IPs, CIDRs) are let through
// even then; rules' header transforms are hutch's credentials. With
// nothing asked, the sandbox gets allow-all when this daemon has
// networking and deny-all when it has none (explicit asks fail instead).
func e2bPolicy(allowInternet *bool, cfg networkConfig, networked bool) (*netpolicy.Policy, error) {
	if !isNull(cfg.EgressProxy) {
		return nil, errdefs.New(errdefs.ErrNotImplemented, "network.egressProxy (SOCKS5) is not supported by hutch")
	}
	if len(cfg.HTTPSPorts) > 0 {
		return nil, errdefs.New(errdefs.ErrNotImplemented, "network.httpsPorts is not supported by hutch")
	}
	asked := allowInternet != nil || len(cfg.AllowOut) > 0 || len(cfg.DenyOut) > 0 || len(cfg.Rules) > 0
	if !asked && !networked {
		return &netpolicy.Policy{Mode: netpolicy.DenyAll}, nil
	}
	closed := allowInternet != nil && !*allowInternet
	var deny []string
	for _, d := range cfg.DenyOut {
		if d == allTraffic {
			closed = true
			continue
		}
		if _, err := netip.ParsePrefix(d); err != nil {
			if _, err := netip.ParseAddr(d); err != nil {
				return nil, errdefs.New(errdefs.ErrInvalidArgument, "network.denyOut %q: IPs and CIDRs only", d)
			}
		}
		deny = append(deny, d)
	}
	p := &netpolicy.Policy{Mode: netpolicy.AllowAll}
	for _, a := range cfg.AllowOut {
		switch {
		case a == allTraffic:
			closed = false
		case isAddrOrPrefix(a):
			p.Allow = append(p.Allow, netpolicy.Rule{CIDR: a})
		default:
			p.Allow = append(p.Allow, netpolicy.Rule{Host: a})
		}
	}
	if closed {
		// Everything else is denied anyway, and in E2B an allowOut entry
		// wins over a denyOut one: the deny list has nothing left to say.
		p.Mode = netpolicy.AllowList
		if len(p.Allow) == 0 {
			p.Mode = netpolicy.DenyAll
		}
	} else {
		p.Deny = deny
	}
	for host, rules := range cfg.Rules {
		headers := map[string]string{}
		for _, r := range rules {
			if r.Transform != nil {
				for k, v := range r.Transform.Headers {
					headers[k] = v
				}
			}
		}
		if len(headers) > 0 {
			p.Credentials = append(p.Credentials, netpolicy.Credential{Host: host, Headers: headers})
		}
	}
	return p, nil
}

func isAddrOrPrefix(s string) bool {
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	_, err := netip.ParsePrefix(s)
	return err == nil && strings.Contains(s, "/")
}

// setNetwork is PUT /sandboxes/{id}/network: the sandbox's egress rules,
// replaced live.
func (h *Handler) setNetwork(w http.ResponseWriter, r *http.Request, tenant string) {
	var body struct {
		AllowInternetAccess *bool `json:"allow_internet_access"`
		networkConfig
	}
	raw, err := readRaw(r)
	if err == nil && len(raw) > 0 {
		err = json.Unmarshal(raw, &body)
	}
	if err != nil {
		h.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "body: %v", err))
		return
	}
	sb, err := h.lookup(r.Context(), tenant, r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// "Omitting a field clears it": an empty update opens the sandbox as
	// a fresh E2B sandbox would be.
	pol, err := e2bPolicy(body.AllowInternetAccess, body.networkConfig, true)
	if err == nil {
		_, err = h.cfg.Manager.SetNetwork(r.Context(), tenant, sb.ID, *pol)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func readRaw(r *http.Request) ([]byte, error) {
	var raw json.RawMessage
	if err := decodeBody(r, &raw); err != nil {
		return nil, err
	}
	return raw, nil
}
