package server

import (
	"context"
	"io"
	"math"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/sandbox"
)

// Health implements api.ServerInterface.
func (s *Server) Health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, api.Health{Status: "ok", Version: s.cfg.Version, Backend: s.mgr.Backend().Name()})
}

// CreateSandbox implements api.ServerInterface.
func (s *Server) CreateSandbox(w http.ResponseWriter, r *http.Request) {
	var req api.CreateSandboxRequest
	if err := decode(w, r, s.lim.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Timeout < 0 || int64(req.Timeout) > math.MaxInt64/int64(time.Second) {
		s.fail(w, r, invalid("timeout %d: want seconds ≥ 0", req.Timeout))
		return
	}
	if m := req.Limits.MemoryMb; m < 0 || m > math.MaxInt64>>20 {
		s.fail(w, r, invalid("memory_mb %d is out of range", m))
		return
	}
	if err := checkSpec(r, req); err != nil {
		s.fail(w, r, err)
		return
	}
	idle, err := lifeSeconds("idle_timeout", req.IdleTimeout)
	var retire time.Duration
	if err == nil {
		retire, err = lifeSeconds("retire_after", req.RetireAfter)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	spec := sandbox.Spec{ID: req.Id, Base: req.Base, Template: req.Template, Env: req.Env, Cwd: req.Cwd,
		Hostname: req.Hostname, Labels: req.Labels, Metadata: req.Metadata,
		Timeout: time.Duration(req.Timeout) * time.Second, OnTimeout: string(req.OnTimeout),
		IdleTimeout: idle, RetireAfter: retire, NoAutoResume: req.AutoResume != nil && !*req.AutoResume, FromArchive: req.FromArchive,
		Limits: backend.Limits{MemoryBytes: req.Limits.MemoryMb << 20, CPUMillis: req.Limits.CpuMillis, Pids: req.Limits.Pids}}
	if req.Network != nil {
		p := fromAPIPolicy(*req.Network)
		spec.Network = &p
	}
	sb, err := s.mgr.Create(r.Context(), tenantOf(r.Context()).ID, spec)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, toAPISandbox(sb))
}

// lifeSeconds reads a lifecycle timer: seconds, 0 for the default, -1 for
// never.
func lifeSeconds(name string, sec int) (time.Duration, error) {
	switch {
	case sec == -1:
		return -1, nil
	case sec < -1 || int64(sec) > math.MaxInt64/int64(time.Second):
		return 0, invalid("%s %d: want seconds ≥ 0, or -1 for never", name, sec)
	}
	return time.Duration(sec) * time.Second, nil
}

// UpdateSandbox implements api.ServerInterface.
func (s *Server) UpdateSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.UpdateSandboxRequest
	if err := decode(w, r, s.lim.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	p, err := toPatch(req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.lifecycle(w, r, func() (sandbox.Sandbox, error) { return s.mgr.Update(r.Context(), s.scope(r), id, p) })
}

func toPatch(req api.UpdateSandboxRequest) (sandbox.Patch, error) {
	var p sandbox.Patch
	if req.Timeout != nil {
		if *req.Timeout < 0 || int64(*req.Timeout) > math.MaxInt64/int64(time.Second) {
			return p, invalid("timeout %d: want seconds ≥ 0", *req.Timeout)
		}
		d := time.Duration(*req.Timeout) * time.Second
		p.Timeout = &d
	}
	if req.OnTimeout != nil {
		o := string(*req.OnTimeout)
		p.OnTimeout = &o
	}
	for _, f := range []struct {
		name string
		in   *int
		out  **time.Duration
	}{{"idle_timeout", req.IdleTimeout, &p.IdleTimeout}, {"retire_after", req.RetireAfter, &p.RetireAfter}} {
		if f.in == nil {
			continue
		}
		d, err := lifeSeconds(f.name, *f.in)
		if err != nil {
			return p, err
		}
		*f.out = &d
	}
	if req.AutoResume != nil {
		no := !*req.AutoResume
		p.NoAutoResume = &no
	}
	return p, nil
}

// lifecycle answers a lifecycle call with the sandbox it leaves.
func (s *Server) lifecycle(w http.ResponseWriter, r *http.Request, op func() (sandbox.Sandbox, error)) {
	sb, err := op()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPISandbox(sb))
}

// PauseSandbox implements api.ServerInterface.
func (s *Server) PauseSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	s.lifecycle(w, r, func() (sandbox.Sandbox, error) { return s.mgr.Pause(r.Context(), s.scope(r), id) })
}

// ResumeSandbox implements api.ServerInterface.
func (s *Server) ResumeSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	s.lifecycle(w, r, func() (sandbox.Sandbox, error) { return s.mgr.Resume(r.Context(), s.scope(r), id) })
}

// SuspendSandbox implements api.ServerInterface.
func (s *Server) SuspendSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	s.lifecycle(w, r, func() (sandbox.Sandbox, error) { return s.mgr.Suspend(r.Context(), s.scope(r), id) })
}

// DownloadSandboxArchive implements api.ServerInterface.
func (s *Server) DownloadSandboxArchive(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	rc, a, err := s.mgr.OpenArchive(r.Context(), s.scope(r), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/zstd")
	w.Header().Set("Content-Length", strconv.FormatInt(a.Size, 10))
	w.Header().Set("X-Hutch-Sha256", a.SHA256)
	_, _ = io.Copy(w, rc)
}

// hostnamePattern is RFC 1123: dot-separated labels of letters, digits
// and inner hyphens. The whole name must also fit sethostname's 64 bytes.
var hostnamePattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

// checkSpec refuses what init could not apply (a hostname sethostname or
// /etc/hosts cannot take, a relative or NUL-bearing cwd, env execve cannot
// pass) and, for a remote tenant, a base that names a host path.
func checkSpec(r *http.Request, req api.CreateSandboxRequest) error {
	if h := req.Hostname; h != "" && (len(h) > 64 || !hostnamePattern.MatchString(h)) {
		return invalid("hostname %q: want an RFC 1123 name of at most 64 bytes", h)
	}
	if c := req.Cwd; c != "" && (!path.IsAbs(c) || strings.IndexByte(c, 0) >= 0) {
		return invalid("cwd %q: want an absolute path without NUL bytes", c)
	}
	if b := req.Base; b != "" && b != "host" && !tenantOf(r.Context()).Trusted {
		// dir: and oci: name files of the host: a remote tenant could
		// read any host directory (or another sandbox's) as its root.
		return errdefs.New(errdefs.ErrPermissionDenied, "base %q: dir: and oci: bases name host paths and are for the local socket only", b)
	}
	return checkEnv(req.Env)
}

// GetSandbox implements api.ServerInterface.
func (s *Server) GetSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	sb, err := s.mgr.Get(r.Context(), s.scope(r), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPISandbox(sb))
}

// scope is the tenant filter for a request: "" (all) on the local socket.
func (s *Server) scope(r *http.Request) string {
	t := tenantOf(r.Context())
	if t.Trusted {
		return ""
	}
	return t.ID
}

// ListSandboxes implements api.ServerInterface.
func (s *Server) ListSandboxes(w http.ResponseWriter, r *http.Request, params api.ListSandboxesParams) {
	opts := sandbox.ListOptions{PageToken: params.PageToken}
	if params.Limit != nil {
		if *params.Limit < 1 || *params.Limit > 1000 {
			s.fail(w, r, invalid("limit %d: want 1-1000", *params.Limit))
			return
		}
		opts.Limit = *params.Limit
	}
	if params.State != "" {
		for _, st := range strings.Split(params.State, ",") {
			opts.States = append(opts.States, sandbox.State(strings.TrimSpace(st)))
		}
	}
	for _, kv := range params.Label {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			s.fail(w, r, invalid("label filter %q: want key=value", kv))
			return
		}
		if opts.Labels == nil {
			opts.Labels = map[string]string{}
		}
		opts.Labels[k] = v
	}
	sbs, next, err := s.mgr.List(r.Context(), s.scope(r), opts)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := api.SandboxList{Sandboxes: make([]api.Sandbox, 0, len(sbs)), NextPageToken: next}
	for _, sb := range sbs {
		out.Sandboxes = append(out.Sandboxes, toAPISandbox(sb))
	}
	writeJSON(w, http.StatusOK, out)
}

// DeleteSandbox implements api.ServerInterface.
func (s *Server) DeleteSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID, params api.DeleteSandboxParams) {
	if err := s.mgr.DeleteBecause(r.Context(), s.scope(r), id, params.Reason); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func toAPISandbox(sb sandbox.Sandbox) api.Sandbox {
	sp := sb.Spec
	base := sp.Base
	if base == "" {
		base = "host"
	}
	out := api.Sandbox{OnTimeout: orText(sp.OnTimeout, "destroy"),
		IdleTimeout: lifeOut(sp.IdleTimeout, sandbox.DefaultIdleTimeout), RetireAfter: lifeOut(sp.RetireAfter, sandbox.DefaultRetireAfter),
		AutoResume: !sp.NoAutoResume, TimeUsed: sb.Timers.Used(time.Now()).Seconds(), Id: sb.ID, State: api.SandboxState(sb.State), Reason: sb.Reason, Base: base,
		Template: sp.Template, Generation: sp.Generation, ForkedFrom: sp.ForkOf, Env: sp.Env, Cwd: sp.Cwd, Hostname: sp.Hostname, Labels: sp.Labels,
		Metadata: sp.Metadata, Timeout: int(sp.Timeout / time.Second), CreatedAt: sb.Created, UpdatedAt: sb.Updated,
		Limits: api.Limits{MemoryMb: sp.Limits.MemoryBytes >> 20, CpuMillis: sp.Limits.CPUMillis, Pids: sp.Limits.Pids}}
	out.NetworkMode = api.SandboxNetworkModeDenyAll
	if sp.Network != nil && sp.Network.Mode != "" {
		out.NetworkMode = api.SandboxNetworkMode(sp.Network.Mode)
	}
	if a := sb.Timers.Archive; a != nil {
		out.Archive = &api.ArchiveInfo{Size: a.Size, Sha256: a.SHA256, Bytes: a.Bytes, CreatedAt: a.Created}
	}
	return out
}

func orText(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// lifeOut shows a timer in seconds, the default filled in, -1 for never.
func lifeOut(d, def time.Duration) int {
	switch {
	case d < 0:
		return -1
	case d == 0:
		return int(def / time.Second)
	}
	return int(d / time.Second)
}

// live resolves a request's sandbox to a running one of its tenant.
// The sandbox counts as busy for the idle timer until the request ends,
// so a long stream, terminal session or transfer is never idle.
func (s *Server) live(r *http.Request, id string) (string, error) {
	sid, err := s.mgr.Live(r.Context(), s.scope(r), id)
	if err == nil {
		context.AfterFunc(r.Context(), s.mgr.Hold(sid))
	}
	return sid, err
}

// backendErr gives a failed backend call its final form: a sandbox whose
// init died is recorded as failed and reported as a conflict.
func (s *Server) backendErr(r *http.Request, id string, err error) error {
	if errdefs.Code(err) == "failed_precondition" || errdefs.Code(err) == "unavailable" {
		return s.mgr.CheckAlive(r.Context(), id, err)
	}
	return err
}
