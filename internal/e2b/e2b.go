// Package e2b makes hutch's daemon speak the wire protocol of the e2b SDK, so
// that the unchanged `e2b` client drives hutch sandboxes: the subset of E2B's
// REST control API the SDK uses (X-API-KEY = a hutch API key, one tenant per
// key) and, per sandbox, "envd": the connect-rpc process.Process and
// filesystem.Filesystem services plus plain GET/POST /files. Wrap puts it in
// front of hutch's own handler on the TCP listener; requests that are
// neither E2B control paths nor envd requests pass through unchanged.
//
// E2B sandboxes are ordinary hutch sandboxes: E2B metadata is hutch
// metadata, a template id names a hutch template ("base" is the default
// base), and E2B's wall-clock timeout is mapped onto hutch's running-time
// timeout (see timeouts in api.go).
package e2b

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/sandbox"
	"github.com/hutch-dev/hutch/internal/store"
)

// EnvdPort is the port the SDK addresses envd on, in a `<port>-<id>.<domain>`
// host or the E2b-Sandbox-Port header.
const EnvdPort = "49983"

// envdVersion is the envd version hutch reports. The SDK gates features on
// it: 0.5.7 enables stdin close and octet-stream uploads; features of later
// versions (file metadata, watch entries) are then refused by the SDK itself
// with its TemplateError instead of being sent and ignored.
const envdVersion = "0.5.7"

// Config configures the E2B front end.
type Config struct {
	Store   *store.Store
	Manager *sandbox.Manager
	Logger  *slog.Logger
	// Domain, when set, routes hosts `49983-<id>.<Domain>` to envd and
	// `api.<Domain>` to the control API.
	Domain string
	// SecretFile keeps the key that envd access tokens are derived from, so
	// tokens survive a restart. It is created (0600) when missing.
	SecretFile string
}

// Handler serves the E2B control API and envd.
type Handler struct {
	cfg    Config
	log    *slog.Logger
	secret []byte
	api    http.Handler
	envd   http.Handler
	procs  *procTable
	watch  *watchers
	errw   *connect.ErrorWriter

	sweepMu sync.Mutex
	swept   time.Time // the last sweep (see sweep)
}

// New makes the handler, loading or creating its token secret.
func New(cfg Config) (*Handler, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	secret, err := loadSecret(cfg.SecretFile)
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, log: cfg.Logger, secret: secret, procs: newProcTable(), watch: newWatchers(),
		errw: connect.NewErrorWriter()}
	h.api = h.apiRoutes()
	h.envd = h.envdRoutes()
	return h, nil
}

// Close stops the polling watchers the handler owns.
func (h *Handler) Close() error {
	h.watch.closeAll()
	return nil
}

func loadSecret(path string) ([]byte, error) {
	if path == "" {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		return b, nil
	}
	b, err := os.ReadFile(path)
	if err == nil && len(b) >= 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("e2b secret: %w", err)
	}
	b = make([]byte, 32)
	_, _ = rand.Read(b)
	// O_EXCL: two daemons on one data directory must not each write one.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("e2b secret: %w", err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		return nil, fmt.Errorf("e2b secret: %w", err)
	}
	return b, f.Sync()
}

// token is a sandbox's envd access token: a MAC of its tenant and id, so
// it needs no storage and says nothing about the API key.
func (h *Handler) token(tenant, id string) string {
	m := hmac.New(sha256.New, h.secret)
	m.Write([]byte(tenant + "\x00" + id))
	return hex.EncodeToString(m.Sum(nil))[:40]
}

func (h *Handler) tokenOK(tenant, id, got string) bool {
	return subtle.ConstantTimeCompare([]byte(h.token(tenant, id)), []byte(got)) == 1
}

// Wrap routes E2B requests to h and everything else to next.
func (h *Handler) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, ok := h.envdTarget(r); ok {
			h.serveEnvd(w, r, id)
			return
		}
		if h.isControl(r) {
			h.api.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// envdTarget finds the sandbox an envd request is for: the host
// `49983-<id>.<domain>`, or the SDK's E2b-Sandbox-Id header (sandbox URL
// mode) when the port header is envd's or absent. Other ports are not
// ours: they pass through.
func (h *Handler) envdTarget(r *http.Request) (string, bool) {
	if h.cfg.Domain != "" {
		host := r.Host
		if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
			host = host[:i]
		}
		if sub, ok := strings.CutSuffix(host, "."+h.cfg.Domain); ok {
			if port, id, ok := strings.Cut(sub, "-"); ok && port == EnvdPort && id != "" && !strings.Contains(id, ".") {
				return id, true
			}
		}
	}
	id := r.Header.Get("E2b-Sandbox-Id")
	if id == "" {
		return "", false
	}
	port := r.Header.Get("E2b-Sandbox-Port")
	return id, port == "" || port == EnvdPort
}

// isControl says whether r is for the E2B control API: its paths (hutch's
// own API lives under /v1 and /metrics, so they do not collide), or any
// path on the `api.<domain>` host.
func (h *Handler) isControl(r *http.Request) bool {
	p := r.URL.Path
	if p == "/sandboxes" || strings.HasPrefix(p, "/sandboxes/") || p == "/v2/sandboxes" || strings.HasPrefix(p, "/v2/sandboxes/") {
		return true
	}
	if h.cfg.Domain != "" {
		host, _, _ := strings.Cut(r.Host, ":")
		return host == "api."+h.cfg.Domain && !strings.HasPrefix(p, "/v1/")
	}
	return false
}

// apiError is E2B's error body: the status repeated as a number, and a
// message.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// fail writes err as E2B's error body. Internal errors are logged and
// answered generically.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := errdefs.HTTPStatus(err)
	msg := err.Error()
	if status == http.StatusInternalServerError {
		h.log.Error("e2b: internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "internal error; see the daemon's log"
	}
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// connectCode maps an error class to the connect code the SDK interprets
// (NotFound → false from kill, DeadlineExceeded → TimeoutError, …).
func connectCode(err error) connect.Code {
	switch errdefs.Code(err) {
	case "invalid_argument":
		return connect.CodeInvalidArgument
	case "unauthenticated":
		return connect.CodeUnauthenticated
	case "permission_denied":
		return connect.CodePermissionDenied
	case "not_found":
		return connect.CodeNotFound
	case "already_exists":
		return connect.CodeAlreadyExists
	case "conflict", "failed_precondition":
		return connect.CodeFailedPrecondition
	case "payload_too_large", "resource_exhausted":
		return connect.CodeResourceExhausted
	case "not_implemented":
		return connect.CodeUnimplemented
	case "unavailable":
		return connect.CodeUnavailable
	case "deadline_exceeded":
		return connect.CodeDeadlineExceeded
	}
	return connect.CodeInternal
}

// rpcError turns err into a connect error; internal causes are logged.
func (h *Handler) rpcError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	code := connectCode(err)
	if code == connect.CodeInternal {
		h.log.Error("e2b envd: internal error", "err", err)
		return connect.NewError(code, errors.New("internal error; see the daemon's log"))
	}
	return connect.NewError(code, err)
}
