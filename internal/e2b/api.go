package e2b

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/sandbox"
)

// defaultTimeout is E2B's default sandbox lifetime when a create names none.
const defaultTimeout = 300 * time.Second

// maxBody bounds a control request's JSON body.
const maxBody = 1 << 20

// baseTemplate is the template id the SDK uses by default; it is hutch's
// default base.
const baseTemplate = "base"

func (h *Handler) apiRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sandboxes", h.authed(h.create))
	mux.HandleFunc("POST /v2/sandboxes", h.authed(h.create))
	mux.HandleFunc("GET /sandboxes", h.authed(h.listV1))
	mux.HandleFunc("GET /v2/sandboxes", h.authed(h.listV2))
	mux.HandleFunc("GET /sandboxes/{id}", h.authed(h.get))
	mux.HandleFunc("DELETE /sandboxes/{id}", h.authed(h.kill))
	mux.HandleFunc("POST /sandboxes/{id}/timeout", h.authed(h.setTimeout))
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", h.authed(h.refresh))
	mux.HandleFunc("POST /sandboxes/{id}/pause", h.authed(h.pause))
	mux.HandleFunc("POST /sandboxes/{id}/resume", h.authed(h.resume))
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", h.authed(h.connect))
	mux.HandleFunc("PUT /sandboxes/{id}/network", h.authed(h.setNetwork))
	// What hutch does not offer through this API answers 501, which the
	// SDK turns into its SandboxError with our message.
	for _, p := range []string{"GET /sandboxes/{id}/metrics", "GET /v2/sandboxes/{id}/logs", "GET /sandboxes/{id}/logs",
		"POST /sandboxes/{id}/snapshots", "POST /sandboxes/{id}/fork"} {
		mux.HandleFunc(p, h.authed(func(w http.ResponseWriter, r *http.Request, _ string) {
			h.fail(w, r, errdefs.New(errdefs.ErrNotImplemented, "%s %s is not supported by hutch's E2B API", r.Method, r.URL.Path))
		}))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, errdefs.New(errdefs.ErrNotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// authed admits a request by its API key (X-API-KEY, as the SDK sends it,
// or a bearer token) and hands the handler the key's tenant.
func (h *Handler) authed(fn func(http.ResponseWriter, *http.Request, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		secret := r.Header.Get("X-API-KEY")
		if secret == "" {
			if scheme, s, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
				secret = strings.TrimSpace(s)
			}
		}
		if secret == "" {
			h.fail(w, r, errdefs.New(errdefs.ErrUnauthenticated, "an API key is needed: X-API-KEY: <hutch API key>"))
			return
		}
		key, err := h.cfg.Store.Authenticate(r.Context(), secret)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		fn(w, r, key.Tenant)
	}
}

// decodeBody reads a JSON body of at most maxBody bytes. Unlike hutch's own
// API it accepts unknown fields: newer SDKs send fields older ones did not,
// and refusing them would break clients that work against E2B. Fields that
// change behaviour hutch lacks are refused explicitly (createRequest.spec).
func decodeBody(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return errdefs.New(errdefs.ErrInvalidArgument, "read body: %v", err)
	}
	if len(b) > maxBody {
		return errdefs.New(errdefs.ErrTooLarge, "body over %d bytes", maxBody)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errdefs.New(errdefs.ErrInvalidArgument, "body: %v", err)
	}
	return nil
}

// createRequest is the SDK's create body. Fields hutch cannot honour
// (volumes, MCP, a SOCKS5 egress proxy) are refused rather than ignored.
type createRequest struct {
	TemplateID          string                  `json:"templateID"`
	Timeout             *int64                  `json:"timeout"`
	Metadata            map[string]string       `json:"metadata"`
	EnvVars             map[string]string       `json:"envVars"`
	AutoPause           *bool                   `json:"autoPause"`
	AutoPauseMemory     *bool                   `json:"autoPauseMemory"`
	AutoResume          *struct{ Enabled bool } `json:"autoResume"`
	Secure              *bool                   `json:"secure"`
	AllowInternetAccess *bool                   `json:"allow_internet_access"`
	Network             json.RawMessage         `json:"network"`
	VolumeMounts        json.RawMessage         `json:"volumeMounts"`
	MCP                 json.RawMessage         `json:"mcp"`
}

func seconds(name string, v *int64, def time.Duration) (time.Duration, error) {
	if v == nil {
		return def, nil
	}
	if *v <= 0 || *v > math.MaxInt64/int64(time.Second) {
		return 0, errdefs.New(errdefs.ErrInvalidArgument, "%s %d: want seconds > 0", name, *v)
	}
	return time.Duration(*v) * time.Second, nil
}

func isNull(m json.RawMessage) bool {
	s := strings.TrimSpace(string(m))
	return s == "" || s == "null"
}

func (req createRequest) spec(networked bool) (sandbox.Spec, error) {
	switch {
	case !isNull(req.VolumeMounts):
		return sandbox.Spec{}, errdefs.New(errdefs.ErrNotImplemented, "volume mounts are not supported by hutch's E2B API")
	case !isNull(req.MCP):
		return sandbox.Spec{}, errdefs.New(errdefs.ErrNotImplemented, "the MCP gateway is not supported by hutch's E2B API")
	}
	timeout, err := seconds("timeout", req.Timeout, defaultTimeout)
	if err == nil {
		err = checkEnv(req.EnvVars)
	}
	if err != nil {
		return sandbox.Spec{}, err
	}
	spec := sandbox.Spec{Env: req.EnvVars, Metadata: req.Metadata, Timeout: timeout, OnTimeout: "destroy",
		// E2B ends sandboxes by their timeout only: no idle suspend.
		IdleTimeout: -1,
		// E2B resumes a paused sandbox on traffic only when asked to.
		NoAutoResume: req.AutoResume == nil || !req.AutoResume.Enabled}
	if req.AutoPause != nil && *req.AutoPause {
		// hutch's on-timeout keeps the files (suspend), not the memory.
		spec.OnTimeout = "suspend"
	}
	if t := req.TemplateID; t != "" && t != baseTemplate {
		spec.Template = t
	}
	netCfg, err := parseNetwork(req.Network)
	if err == nil {
		spec.Network, err = e2bPolicy(req.AllowInternetAccess, netCfg, networked)
	}
	if err != nil {
		return sandbox.Spec{}, err
	}
	// E2B serves every port of a sandbox at <port>-<id>.<domain>, public
	// unless allowPublicTraffic is false; then E2B's trafficAccessToken
	// (sent as e2b-traffic-access-token) opens them.
	spec.Ports = []sandbox.ExposedPort{{Port: sandbox.AllPorts, Public: netCfg.public(), Token: sandbox.NewPortToken()}}
	return spec, nil
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, tenant string) {
	var req createRequest
	if err := decodeBody(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	spec, err := req.spec(h.cfg.Manager.Networked())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	sb, err := h.cfg.Manager.Create(r.Context(), tenant, spec)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, h.view(sb, time.Now()))
}

// sandboxView is E2B's sandbox object (create, get, list, connect).
type sandboxView struct {
	TemplateID      string `json:"templateID"`
	SandboxID       string `json:"sandboxID"`
	Alias           string `json:"alias,omitempty"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
	// TrafficAccessToken opens the sandbox's ports when they are not public.
	TrafficAccessToken string            `json:"trafficAccessToken,omitempty"`
	Domain             *string           `json:"domain"`
	StartedAt          time.Time         `json:"startedAt"`
	EndAt              time.Time         `json:"endAt"`
	CPUCount           int64             `json:"cpuCount"`
	MemoryMB           int64             `json:"memoryMB"`
	DiskSizeMB         int64             `json:"diskSizeMB"`
	Metadata           map[string]string `json:"metadata"`
	State              string            `json:"state"`
	Lifecycle          lifecycleView     `json:"lifecycle"`
}

type lifecycleView struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// e2bState is the E2B state of a hutch state: paused, suspended and
// retired sandboxes can all be resumed, which is what E2B's paused means.
func e2bState(s sandbox.State) (string, bool) {
	switch s {
	case sandbox.Running, sandbox.Creating:
		return "running", true
	case sandbox.Paused, sandbox.Suspended, sandbox.Retired:
		return "paused", true
	}
	return "", false
}

// endAt is when the sandbox's timeout ends it if it keeps running from
// now: hutch counts running time only, E2B reports a wall-clock end.
func endAt(sb sandbox.Sandbox, now time.Time) time.Time {
	left := max(sb.Spec.Timeout-sb.Timers.Used(now), 0)
	return now.Add(left).UTC()
}

func (h *Handler) view(sb sandbox.Sandbox, now time.Time) sandboxView {
	state, _ := e2bState(sb.State)
	tpl := cmp.Or(sb.Spec.Template, baseTemplate)
	cpus := max(int64(1), sb.Spec.Limits.CPUMillis/1000)
	mem := cmp.Or(sb.Spec.Limits.MemoryBytes>>20, 2048)
	on := "kill"
	if sb.Spec.OnTimeout == "suspend" {
		on = "pause"
	}
	md := sb.Spec.Metadata
	if md == nil {
		md = map[string]string{}
	}
	v := sandboxView{TemplateID: tpl, SandboxID: sb.ID, Alias: sb.Spec.Template, ClientID: "hutch",
		EnvdVersion: envdVersion, EnvdAccessToken: h.token(sb.Tenant, sb.ID),
		StartedAt: sb.Created.UTC(), EndAt: endAt(sb, now), CPUCount: cpus, MemoryMB: mem, Metadata: md, State: state,
		Lifecycle: lifecycleView{OnTimeout: on, AutoResume: !sb.Spec.NoAutoResume}}
	for _, p := range sb.Spec.Ports {
		if p.Port == sandbox.AllPorts && !p.Public {
			v.TrafficAccessToken = p.Token
		}
	}
	return v
}

// lookup returns a sandbox E2B still knows: a destroyed or failed one is
// gone (404), as in E2B.
func (h *Handler) lookup(ctx context.Context, tenant, id string) (sandbox.Sandbox, error) {
	sb, err := h.cfg.Manager.Get(ctx, tenant, id)
	if err != nil {
		return sb, err
	}
	if _, ok := e2bState(sb.State); !ok {
		return sb, errdefs.New(errdefs.ErrNotFound, "sandbox %s is %s", id, sb.State)
	}
	return sb, nil
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request, tenant string) {
	sb, err := h.lookup(r.Context(), tenant, r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, h.view(sb, time.Now()))
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request, tenant string) {
	id := r.PathValue("id")
	if _, err := h.lookup(r.Context(), tenant, id); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := h.cfg.Manager.Delete(r.Context(), tenant, id); err != nil {
		h.fail(w, r, err)
		return
	}
	h.procs.forget(id)
	h.watch.forget(id)
	w.WriteHeader(http.StatusNoContent)
}

// extend makes the sandbox end d from now (at least d when atLeast):
// hutch's timeout is running time since creation, so the new timeout is
// the time used so far plus d.
func (h *Handler) extend(ctx context.Context, tenant string, sb sandbox.Sandbox, d time.Duration, atLeast bool) error {
	now := time.Now()
	used := sb.Timers.Used(now)
	if atLeast && sb.Spec.Timeout-used >= d {
		return nil
	}
	t := used + d
	_, err := h.cfg.Manager.Update(ctx, tenant, sb.ID, sandbox.Patch{Timeout: &t})
	return err
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request, tenant string) {
	h.retime(w, r, tenant, "timeout", false)
}

func (h *Handler) refresh(w http.ResponseWriter, r *http.Request, tenant string) {
	h.retime(w, r, tenant, "duration", true)
}

func (h *Handler) retime(w http.ResponseWriter, r *http.Request, tenant, field string, atLeast bool) {
	var body map[string]*int64
	if err := decodeBody(r, &body); err != nil {
		h.fail(w, r, err)
		return
	}
	d, err := seconds(field, body[field], defaultTimeout)
	if err == nil && body[field] == nil && !atLeast {
		err = errdefs.New(errdefs.ErrInvalidArgument, "%s is required", field)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	sb, err := h.lookup(r.Context(), tenant, r.PathValue("id"))
	if err == nil {
		err = h.extend(r.Context(), tenant, sb, d, atLeast)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pause freezes a running sandbox with its processes and memory (hutch's
// pause), or, when the SDK asks not to keep memory, suspends it (files
// only). Pausing a paused one is 409, which the SDK reports as false.
func (h *Handler) pause(w http.ResponseWriter, r *http.Request, tenant string) {
	var body struct {
		Memory *bool `json:"memory"`
	}
	if err := decodeBody(r, &body); err != nil {
		h.fail(w, r, err)
		return
	}
	sb, err := h.lookup(r.Context(), tenant, r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if sb.State != sandbox.Running {
		h.fail(w, r, errdefs.New(errdefs.ErrConflict, "sandbox %s is already paused (%s)", sb.ID, sb.State))
		return
	}
	if body.Memory != nil && !*body.Memory {
		_, err = h.cfg.Manager.Suspend(r.Context(), tenant, sb.ID)
	} else {
		_, err = h.cfg.Manager.Pause(r.Context(), tenant, sb.ID)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resume is the v1 resume: only a paused sandbox (409 for a running one).
func (h *Handler) resume(w http.ResponseWriter, r *http.Request, tenant string) {
	h.wake(w, r, tenant, false)
}

// connect is the v2 connect: a running sandbox answers 200, a paused one is
// resumed and answers 201.
func (h *Handler) connect(w http.ResponseWriter, r *http.Request, tenant string) {
	h.wake(w, r, tenant, true)
}

func (h *Handler) wake(w http.ResponseWriter, r *http.Request, tenant string, runningOK bool) {
	var body struct {
		Timeout   *int64 `json:"timeout"`
		AutoPause *bool  `json:"autoPause"`
		Memory    *bool  `json:"memory"`
	}
	if err := decodeBody(r, &body); err != nil {
		h.fail(w, r, err)
		return
	}
	d, err := seconds("timeout", body.Timeout, defaultTimeout)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx := r.Context()
	sb, err := h.lookup(ctx, tenant, r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	status := http.StatusCreated
	if sb.State == sandbox.Running {
		if !runningOK {
			h.fail(w, r, errdefs.New(errdefs.ErrConflict, "sandbox %s is already running", sb.ID))
			return
		}
		status = http.StatusOK
	} else if sb, err = h.cfg.Manager.Resume(ctx, tenant, sb.ID); err != nil {
		h.fail(w, r, err)
		return
	}
	if err = h.extend(ctx, tenant, sb, d, true); err == nil {
		sb, err = h.lookup(ctx, tenant, sb.ID)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, status, h.view(sb, time.Now()))
}

// listQuery is a listing's filters and page.
type listQuery struct {
	states   []sandbox.State
	metadata map[string]string
	limit    int
	token    string
	desc     bool
}

// parseMetadata reads the SDK's metadata filter: one query parameter whose
// value is itself a query string of url-encoded pairs.
func parseMetadata(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(s)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "metadata filter %q: %v", s, err)
	}
	out := map[string]string{}
	for k, v := range vals {
		// The SDK encodes each key and value once more before joining.
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(v[len(v)-1])
		if err1 != nil || err2 != nil {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "metadata filter %q: bad escape", s)
		}
		out[key] = val
	}
	return out, nil
}

func parseList(q url.Values, v2 bool) (listQuery, error) {
	lq := listQuery{limit: 100, token: q.Get("nextToken")}
	var err error
	if lq.metadata, err = parseMetadata(q.Get("metadata")); err != nil {
		return lq, err
	}
	states := "running"
	if v2 {
		states = cmp.Or(q.Get("state"), "running,paused")
	}
	for s := range strings.SplitSeq(states, ",") {
		switch strings.TrimSpace(s) {
		case "running":
			lq.states = append(lq.states, sandbox.Running)
		case "paused":
			lq.states = append(lq.states, sandbox.Paused, sandbox.Suspended, sandbox.Retired)
		default:
			return lq, errdefs.New(errdefs.ErrInvalidArgument, "state %q: want running or paused", s)
		}
	}
	if l := q.Get("limit"); l != "" {
		if lq.limit, err = strconv.Atoi(l); err != nil || lq.limit < 1 || lq.limit > 1000 {
			return lq, errdefs.New(errdefs.ErrInvalidArgument, "limit %q: want 1..1000", l)
		}
	}
	switch q.Get("order") {
	case "", "asc":
	case "desc":
		lq.desc = true
	default:
		return lq, errdefs.New(errdefs.ErrInvalidArgument, "order %q: want asc or desc", q.Get("order"))
	}
	return lq, nil
}

// matching lists every sandbox of tenant that passes the filters, in start
// order. hutch filters state in the store; metadata is filtered here.
func (h *Handler) matching(ctx context.Context, tenant string, lq listQuery) ([]sandbox.Sandbox, error) {
	var out []sandbox.Sandbox
	token := ""
	for {
		page, next, err := h.cfg.Manager.List(ctx, tenant, sandbox.ListOptions{States: lq.states, Limit: 500, PageToken: token})
		if err != nil {
			return nil, err
		}
		for _, sb := range page {
			if hasMetadata(sb.Spec.Metadata, lq.metadata) && sb.Spec.Pool == nil {
				out = append(out, sb)
			}
		}
		if next == "" {
			break
		}
		token = next
	}
	slices.SortFunc(out, func(a, b sandbox.Sandbox) int {
		return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.ID, b.ID))
	})
	if lq.desc {
		slices.Reverse(out)
	}
	return out, nil
}

func hasMetadata(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// page cuts one page after the token, which names the last sandbox of the
// previous page by start time and id, so creates and kills in between
// neither repeat nor skip the others.
func page(all []sandbox.Sandbox, lq listQuery) ([]sandbox.Sandbox, string, error) {
	start := 0
	if lq.token != "" {
		raw, err := base64.RawURLEncoding.DecodeString(lq.token)
		ns, id, ok := strings.Cut(string(raw), "/")
		n, perr := strconv.ParseInt(ns, 10, 64)
		if err != nil || !ok || perr != nil {
			return nil, "", errdefs.New(errdefs.ErrInvalidArgument, "nextToken %q is not one this server gave", lq.token)
		}
		at := time.Unix(0, n)
		start = len(all)
		for i, sb := range all {
			c := cmp.Or(sb.Created.Compare(at), strings.Compare(sb.ID, id))
			if (lq.desc && c < 0) || (!lq.desc && c > 0) {
				start = i
				break
			}
		}
	}
	end := min(start+lq.limit, len(all))
	next := ""
	if end < len(all) {
		last := all[end-1]
		next = base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, "%d/%s", last.Created.UnixNano(), last.ID))
	}
	return all[start:end], next, nil
}

func (h *Handler) listV1(w http.ResponseWriter, r *http.Request, tenant string) {
	h.list(w, r, tenant, false)
}

func (h *Handler) listV2(w http.ResponseWriter, r *http.Request, tenant string) {
	h.list(w, r, tenant, true)
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request, tenant string, v2 bool) {
	lq, err := parseList(r.URL.Query(), v2)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	all, err := h.matching(r.Context(), tenant, lq)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if !v2 {
		lq.limit = len(all) + 1 // v1 has no pages
	}
	items, next, err := page(all, lq)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	now := time.Now()
	out := make([]sandboxView, 0, len(items))
	for _, sb := range items {
		v := h.view(sb, now)
		v.EnvdAccessToken = "" // listings do not hand out envd access
		out = append(out, v)
	}
	writeJSON(w, http.StatusOK, out)
}
