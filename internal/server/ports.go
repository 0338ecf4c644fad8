package server

import (
	"cmp"
	"context"
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/sandbox"
)

// Exposed ports: requests reach a sandbox port through the daemon, by path
// (/v1/sandboxes/{id}/ports/{port}/...) or, with a domain, by host
// (http://{port}-{id}.{domain}/...). The daemon dials the port from inside
// the sandbox's network namespace, so this works under any policy.

const (
	portTokenHeader = "X-Hutch-Port-Token"
	portTokenQuery  = "hutch_port_token"
	// e2bTrafficHeader carries the token of an E2B sandbox whose ports are
	// not public (E2B's trafficAccessToken).
	e2bTrafficHeader = "E2b-Traffic-Access-Token"
)

var portPathRE = regexp.MustCompile(`^/v1/sandboxes/[^/]+/ports/[0-9]+/`)

// ExposePort implements api.ServerInterface.
func (s *Server) ExposePort(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.ExposePortRequest
	if err := decode(w, r, s.lim.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	ep, err := s.mgr.ExposePort(r.Context(), s.scope(r), id, req.Port, req.Public)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.toAPIPort(id, ep))
}

// ListPorts implements api.ServerInterface.
func (s *Server) ListPorts(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	ports, err := s.mgr.Ports(r.Context(), s.scope(r), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := api.ExposedPortList{Ports: make([]api.ExposedPort, 0, len(ports))}
	for _, p := range ports {
		out.Ports = append(out.Ports, s.toAPIPort(id, p))
	}
	writeJSON(w, http.StatusOK, out)
}

// UnexposePort implements api.ServerInterface.
func (s *Server) UnexposePort(w http.ResponseWriter, r *http.Request, id api.SandboxID, port int) {
	if err := s.mgr.UnexposePort(r.Context(), s.scope(r), id, port); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) toAPIPort(id string, p sandbox.ExposedPort) api.ExposedPort {
	port := strconv.Itoa(p.Port)
	if p.Port == sandbox.AllPorts {
		port = "{port}"
	}
	out := api.ExposedPort{Port: p.Port, Public: p.Public, Token: p.Token,
		Path: fmt.Sprintf("/v1/sandboxes/%s/ports/%s/", id, port)}
	if s.cfg.Domain != "" {
		out.Url = fmt.Sprintf("http://%s-%s.%s/", port, id, s.cfg.Domain)
	}
	return out
}

// portTarget recognizes a request for an exposed port: by host when the
// daemon has a domain, or by path.
func (s *Server) portTarget(r *http.Request) (id string, port int, path string, ok bool) {
	if sub, found := s.portHost(r.Host); found {
		p, rest, _ := strings.Cut(sub, "-")
		if n, err := strconv.Atoi(p); err == nil && rest != "" {
			return rest, n, r.URL.Path, true
		}
	}
	if portPathRE.MatchString(r.URL.Path) {
		parts := strings.SplitN(r.URL.Path, "/", 7) // "", v1, sandboxes, id, ports, port, rest
		if n, err := strconv.Atoi(parts[5]); err == nil && len(parts) == 7 {
			return parts[3], n, "/" + parts[6], true
		}
	}
	return "", 0, "", false
}

// portHost returns the "{port}-{id}" label of a host under the domain.
func (s *Server) portHost(host string) (string, bool) {
	if s.cfg.Domain == "" {
		return "", false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	sub, ok := strings.CutSuffix(strings.ToLower(host), "."+strings.ToLower(s.cfg.Domain))
	if !ok || sub == "" || strings.Contains(sub, ".") {
		return "", false
	}
	return sub, true
}

// servePort proxies one request (HTTP or a WebSocket upgrade) to an
// exposed port, after checking the caller may use it: the local socket,
// an API key of the sandbox's tenant, the port's token, or a public port.
func (s *Server) servePort(w http.ResponseWriter, r *http.Request, id string, port int, path string) {
	tenant, ep, err := s.mgr.Port(r.Context(), id, port)
	if err != nil {
		if errdefs.Code(err) == "not_found" {
			err = errdefs.New(errdefs.ErrNotFound, "port %d of sandbox %s is not exposed", port, id)
		}
		s.fail(w, r, err)
		return
	}
	caller := tenantOf(r.Context())
	keyed := caller.Trusted || (caller.ID != "" && caller.ID == tenant)
	token := cmp.Or(r.Header.Get(portTokenHeader), r.Header.Get(e2bTrafficHeader), r.URL.Query().Get(portTokenQuery))
	tokenOK := token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(ep.Token)) == 1
	if !keyed && !tokenOK && !ep.Public {
		if caller.ID != "" {
			// Another tenant's key: as everywhere else, its sandboxes do
			// not exist for this one.
			s.fail(w, r, errdefs.New(errdefs.ErrNotFound, "sandbox %s: not found", id))
		} else if token != "" {
			s.fail(w, r, errdefs.New(errdefs.ErrPermissionDenied, "this key or token does not open port %d of sandbox %s", port, id))
		} else {
			s.fail(w, r, errdefs.New(errdefs.ErrUnauthenticated, "port %d of sandbox %s needs an API key or its token (%s)", port, id, portTokenHeader))
		}
		return
	}
	pd, ok := s.mgr.Backend().(backend.PortDialer)
	if !ok {
		s.fail(w, r, errdefs.New(errdefs.ErrNotImplemented, "backend %s cannot expose ports", s.mgr.Backend().Name()))
		return
	}
	sid, err := s.live(r.WithContext(context.WithValue(r.Context(), tenantKey, Tenant{Trusted: true})), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.portProxy(pd, sid, port, path, caller.ID != "").ServeHTTP(w, r)
}

func (s *Server) portProxy(pd backend.PortDialer, id string, port int, path string, byKey bool) http.Handler {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return pd.DialPort(ctx, id, port)
		},
		DisableKeepAlives:     true,
		ResponseHeaderTimeout: 5 * time.Minute,
	}
	return &httputil.ReverseProxy{
		Transport: tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			out := pr.Out
			out.URL.Scheme, out.URL.Host, out.URL.Path, out.URL.RawPath = "http", fmt.Sprintf("localhost:%d", port), path, ""
			q := out.URL.Query()
			if q.Has(portTokenQuery) {
				q.Del(portTokenQuery)
				out.URL.RawQuery = q.Encode()
			}
			if _, byHost := s.portHost(pr.In.Host); !byHost {
				out.Host = out.URL.Host
			}
			// hutch's own credentials never reach the sandbox.
			out.Header.Del(portTokenHeader)
			out.Header.Del(e2bTrafficHeader)
			if byKey {
				out.Header.Del("Authorization")
			}
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			s.fail(w, r, errdefs.New(errdefs.ErrUnavailable, "port %d of sandbox %s: %v", port, id, err))
		},
	}
}
