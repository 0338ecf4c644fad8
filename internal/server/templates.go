package server

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"net/http"
	"strconv"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/netpolicy"
	"github.com/hutch-dev/hutch/internal/sandbox"
)

// maxTemplateBody bounds a template definition: its files are inline
// (base64 takes a third more than the manager's 32 MiB of content).
const maxTemplateBody = 48 << 20

// templateTenant is the namespace of a request's templates: its key's
// tenant, or "" for the local socket's own.
func templateTenant(r *http.Request) string { return tenantOf(r.Context()).ID }

// ListTemplates implements api.ServerInterface.
func (s *Server) ListTemplates(w http.ResponseWriter, r *http.Request) {
	t := tenantOf(r.Context())
	ts, err := s.mgr.ListTemplates(r.Context(), t.ID, t.Trusted)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := api.TemplateList{Templates: make([]api.Template, 0, len(ts))}
	for _, tp := range ts {
		out.Templates = append(out.Templates, toAPITemplate(tp, t.Trusted))
	}
	writeJSON(w, http.StatusOK, out)
}

// GetTemplate implements api.ServerInterface.
func (s *Server) GetTemplate(w http.ResponseWriter, r *http.Request, name api.TemplateName) {
	tp, err := s.mgr.GetTemplate(r.Context(), templateTenant(r), name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPITemplate(tp, tenantOf(r.Context()).Trusted))
}

// PutTemplate implements api.ServerInterface.
func (s *Server) PutTemplate(w http.ResponseWriter, r *http.Request, name api.TemplateName) {
	var req api.TemplateDefinition
	if err := decode(w, r, max(s.lim.MaxBodyBytes, maxTemplateBody), &req); err != nil {
		s.fail(w, r, err)
		return
	}
	def, err := toTemplateDef(r, req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	tp, err := s.mgr.PutTemplate(r.Context(), templateTenant(r), name, def)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPITemplate(tp, tenantOf(r.Context()).Trusted))
}

// toTemplateDef checks a definition the way checkSpec checks a create: a
// remote tenant may name no host path, neither as a base nor as a mount.
func toTemplateDef(r *http.Request, req api.TemplateDefinition) (sandbox.TemplateDef, error) {
	var def sandbox.TemplateDef
	if err := checkSpec(r, api.CreateSandboxRequest{Base: req.Base, Cwd: req.Cwd, Env: req.Env}); err != nil {
		return def, err
	}
	if len(req.Mounts) > 0 && !tenantOf(r.Context()).Trusted {
		return def, errdefs.New(errdefs.ErrPermissionDenied, "mounts name host directories and are for the local socket only; seed files instead")
	}
	lim, err := toLimits(req.Limits)
	if err != nil {
		return def, err
	}
	def = sandbox.TemplateDef{Base: req.Base, Setup: req.Setup, Env: req.Env, Cwd: req.Cwd, Limits: lim}
	if req.BuildNetwork != nil {
		p := fromAPIPolicy(*req.BuildNetwork)
		def.Network = &p
	}
	for _, f := range req.Files {
		content, err := decodeContent(f)
		if err != nil {
			return def, err
		}
		mode, err := parseMode(f.Mode, 0o644)
		if err != nil {
			return def, invalid("file %q: %v", f.Path, err)
		}
		def.Files = append(def.Files, sandbox.TemplateFile{Path: f.Path, Content: content, Mode: mode})
	}
	for _, mt := range req.Mounts {
		def.Mounts = append(def.Mounts, sandbox.TemplateMount{Path: mt.Path, Source: mt.Source})
	}
	return def, nil
}

func decodeContent(f api.TemplateFile) ([]byte, error) {
	switch f.Encoding {
	case "", "utf8":
		return []byte(f.Content), nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(f.Content)
		if err != nil {
			return nil, invalid("file %q: content is not valid base64: %v", f.Path, err)
		}
		return b, nil
	}
	return nil, invalid("file %q: encoding %q: want utf8 or base64", f.Path, f.Encoding)
}

func toLimits(l api.Limits) (backend.Limits, error) {
	if m := l.MemoryMb; m < 0 || m > 1<<40 {
		return backend.Limits{}, invalid("memory_mb %d is out of range", m)
	}
	return backend.Limits{MemoryBytes: l.MemoryMb << 20, CPUMillis: l.CpuMillis, Pids: l.Pids}, nil
}

// DeleteTemplate implements api.ServerInterface.
func (s *Server) DeleteTemplate(w http.ResponseWriter, r *http.Request, name api.TemplateName) {
	if err := s.mgr.DeleteTemplate(r.Context(), templateTenant(r), name); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// BuildTemplate implements api.ServerInterface: the build's events as
// NDJSON, ending with done or error. Errors before anything is streamed
// (an unknown template) are plain error responses.
func (s *Server) BuildTemplate(w http.ResponseWriter, r *http.Request, name api.TemplateName) {
	tenant := templateTenant(r)
	if _, err := s.mgr.GetTemplate(r.Context(), tenant, name); err != nil {
		s.fail(w, r, err)
		return
	}
	bw := &buildWriter{w: w}
	tp, cached, err := s.mgr.BuildTemplate(r.Context(), tenant, name, func(ev sandbox.BuildEvent) {
		_ = bw.write(api.TemplateBuildEvent{Type: api.TemplateBuildEventType(ev.Type), Step: ev.Step, Cmd: ev.Cmd, Data: ev.Data})
	})
	if err != nil {
		_, body := s.apiError(r, err)
		_ = bw.write(api.TemplateBuildEvent{Type: api.TemplateBuildEventTypeError, Error: &body})
		return
	}
	at := toAPITemplate(tp, tenantOf(r.Context()).Trusted)
	_ = bw.write(api.TemplateBuildEvent{Type: api.TemplateBuildEventTypeDone, Generation: tp.Generation, Cached: cached, Template: &at})
}

// buildWriter writes NDJSON build events, flushing each.
type buildWriter struct {
	w       http.ResponseWriter
	started bool
}

func (b *buildWriter) write(ev api.TemplateBuildEvent) error {
	if !b.started {
		b.started = true
		b.w.Header().Set("Content-Type", "application/x-ndjson")
		b.w.Header().Set("X-Accel-Buffering", "no")
		b.w.WriteHeader(http.StatusOK)
	}
	line, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if _, err := b.w.Write(append(line, '\n')); err != nil {
		return err
	}
	return http.NewResponseController(b.w).Flush()
}

// SetTemplatePool implements api.ServerInterface.
func (s *Server) SetTemplatePool(w http.ResponseWriter, r *http.Request, name api.TemplateName) {
	var req struct {
		Size *int `json:"size"`
	}
	if err := decode(w, r, s.lim.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Size == nil {
		s.fail(w, r, invalid("size is missing"))
		return
	}
	tp, err := s.mgr.SetPool(r.Context(), templateTenant(r), name, *req.Size)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPITemplate(tp, tenantOf(r.Context()).Trusted))
}

// SnapshotSandbox implements api.ServerInterface.
func (s *Server) SnapshotSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.SnapshotRequest
	if err := decode(w, r, s.lim.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	// The request's scope is both where the sandbox is looked up (the
	// local socket reaches every tenant's) and the caller's templates.
	tp, err := s.mgr.Snapshot(r.Context(), s.scope(r), id, req.Template)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, toAPITemplate(tp, tenantOf(r.Context()).Trusted))
}

// ForkSandbox implements api.ServerInterface.
func (s *Server) ForkSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.ForkRequest
	if err := decode(w, r, s.lim.MaxBodyBytes, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sbs, err := s.mgr.Fork(r.Context(), s.scope(r), id, sandbox.ForkOptions{Count: req.Count, Labels: req.Labels, Metadata: req.Metadata})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := api.SandboxList{Sandboxes: make([]api.Sandbox, 0, len(sbs))}
	for _, sb := range sbs {
		out.Sandboxes = append(out.Sandboxes, toAPISandbox(sb))
	}
	writeJSON(w, http.StatusCreated, out)
}

func toAPITemplate(t sandbox.Template, showTenant bool) api.Template {
	d := t.Def
	out := api.Template{Name: t.Name, Kind: api.Recipe, Base: orText(d.Base, "host"), Setup: d.Setup, Env: d.Env, Cwd: d.Cwd,
		Limits:     api.Limits{MemoryMb: d.Limits.MemoryBytes >> 20, CpuMillis: d.Limits.CPUMillis, Pids: d.Limits.Pids},
		Generation: t.Generation, Status: t.Status, Pool: api.TemplatePool{Size: t.PoolSize, Ready: t.PoolReady},
		CreatedAt: t.Created, UpdatedAt: t.Updated}
	if showTenant {
		out.Tenant = t.Tenant
	}
	if d.Network != nil {
		if pol, err := netpolicy.Compile(*d.Network); err == nil {
			p := toAPIPolicy(pol.Redacted())
			out.BuildNetwork = &p
		}
	}
	if d.Snapshot != nil {
		out.Kind, out.SnapshotOf = api.Snapshot, d.Snapshot.Sandbox
	}
	for _, f := range d.Files {
		sum := sha256.Sum256(f.Content)
		out.Files = append(out.Files, api.TemplateFileInfo{Path: f.Path, Mode: modeString(f.Mode), Size: int64(len(f.Content)),
			Sha256: hex.EncodeToString(sum[:])})
	}
	for _, mt := range d.Mounts {
		out.Mounts = append(out.Mounts, api.TemplateMount{Path: mt.Path, Source: mt.Source})
	}
	if b := t.Build; b.State != "" {
		out.LastBuild = &api.TemplateBuild{State: b.State, Generation: b.Generation, Error: b.Error,
			Log: b.Log, At: b.At}
	}
	return out
}

// modeString is the octal form parseMode reads.
func modeString(m fs.FileMode) string {
	n := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		n |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		n |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		n |= 0o1000
	}
	return "0" + strconv.FormatUint(uint64(n), 8)
}
