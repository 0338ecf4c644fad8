package e2b

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"

	"connectrpc.com/connect"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/e2b/envdpb/filesystem/filesystempbconnect"
	"github.com/hutch-dev/hutch/internal/e2b/envdpb/process/processpbconnect"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// maxMessage bounds one envd request message.
const maxMessage = 16 << 20

// target is the sandbox an envd request acts on, found and authorized by
// serveEnvd before any handler runs.
type target struct {
	tenant string
	id     string
}

type targetKey struct{}

func targetOf(ctx context.Context) target {
	t, _ := ctx.Value(targetKey{}).(target)
	return t
}

func (h *Handler) envdRoutes() http.Handler {
	mux := http.NewServeMux()
	// Bounded messages: stdin arrives in SendInput messages, nothing else
	// is large.
	limit := connect.WithReadMaxBytes(maxMessage)
	mux.Handle(processpbconnect.NewProcessHandler(&processService{h: h}, limit))
	mux.Handle(filesystempbconnect.NewFilesystemHandler(&filesystemService{h: h}, limit))
	mux.HandleFunc("GET /files", h.download)
	mux.HandleFunc("POST /files", h.upload)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, errdefs.New(errdefs.ErrNotFound, "envd: no route for %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// serveEnvd authorizes an envd request by the sandbox's access token
// (X-Access-Token: the SDK sends envd no API key), makes sure the sandbox
// runs (resuming it when it was created with auto-resume), and serves it.
func (h *Handler) serveEnvd(w http.ResponseWriter, r *http.Request, id string) {
	ctx := r.Context()
	sb, err := h.cfg.Manager.Get(ctx, "", id)
	if err == nil {
		if _, ok := e2bState(sb.State); !ok {
			err = errdefs.New(errdefs.ErrNotFound, "sandbox %s is %s", id, sb.State)
		}
	}
	if r.URL.Path == "/health" {
		// The SDK probes health after a dropped connection: 502 means the
		// sandbox is gone.
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if err != nil || !h.tokenOK(sb.Tenant, id, r.Header.Get("X-Access-Token")) {
		// Unknown and foreign sandboxes look the same as a bad token.
		h.envdFail(w, r, errdefs.New(errdefs.ErrUnauthenticated, "envd of sandbox %s: a valid X-Access-Token is needed", id))
		return
	}
	if _, err := h.cfg.Manager.Live(ctx, sb.Tenant, id); err != nil {
		h.envdFail(w, r, err)
		return
	}
	defer h.cfg.Manager.Hold(id)()
	h.envd.ServeHTTP(w, r.WithContext(context.WithValue(ctx, targetKey{}, target{tenant: sb.Tenant, id: id})))
}

// envdFail answers an error before any envd handler ran: as a connect
// error to an RPC (so the SDK sees its code and message), as E2B's JSON
// body otherwise.
func (h *Handler) envdFail(w http.ResponseWriter, r *http.Request, err error) {
	if h.errw.IsSupported(r) {
		_ = h.errw.Write(w, r, h.rpcError(err))
		return
	}
	h.fail(w, r, err)
}

// files returns the backend's file capability.
func (h *Handler) files() (backend.FileAccessor, error) {
	fa, ok := h.cfg.Manager.Backend().(backend.FileAccessor)
	if !ok {
		return nil, errdefs.New(errdefs.ErrNotImplemented, "the %s backend has no file access", h.cfg.Manager.Backend().Name())
	}
	return fa, nil
}

// download is GET /files?path=: the file's bytes.
func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	p := r.URL.Query().Get("path")
	if p == "" {
		h.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "path is required"))
		return
	}
	fa, err := h.files()
	if err != nil {
		h.fail(w, r, err)
		return
	}
	info, err := fa.Stat(r.Context(), t.id, p)
	if err == nil && info.IsDir {
		err = errdefs.New(errdefs.ErrInvalidArgument, "%s is a directory", p)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rc, err := fa.ReadFile(r.Context(), t.id, p)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(info.Path)}))
	_, _ = io.Copy(w, rc)
}

// writeInfo is what envd answers for each written file.
type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// upload is POST /files: one file as the raw body (octet-stream, path in
// the query) or several as multipart parts named "file" whose file names
// are their paths (or the query's path).
func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	qpath := r.URL.Query().Get("path")
	fa, err := h.files()
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var body io.Reader = r.Body
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			h.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "gzip body: %v", err))
			return
		}
		defer zr.Close()
		body = zr
	default:
		h.fail(w, r, errdefs.New(errdefs.ErrNotImplemented, "Content-Encoding %q is not supported", enc))
		return
	}
	var out []writeInfo
	write := func(p string, body io.Reader) error {
		if p == "" {
			return errdefs.New(errdefs.ErrInvalidArgument, "a file needs a path")
		}
		if err := fa.WriteFile(r.Context(), t.id, p, 0o644, body); err != nil {
			return err
		}
		info, err := fa.Stat(r.Context(), t.id, p)
		if err != nil {
			return err
		}
		out = append(out, writeInfo{Name: info.Name, Type: "file", Path: info.Path})
		return nil
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		err = eachPart(multipart.NewReader(body, params["boundary"]), func(part *multipart.Part) error {
			// Not part.FileName(): it keeps only the base name, and the
			// SDK sends the whole path there.
			_, disp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			p := disp["filename"]
			if qpath != "" {
				p = qpath
			}
			return write(p, part)
		})
	} else {
		err = write(qpath, body)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if len(out) == 0 {
		h.fail(w, r, errdefs.New(errdefs.ErrInvalidArgument, "no file in the request"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func eachPart(mr *multipart.Reader, fn func(*multipart.Part) error) error {
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return errdefs.New(errdefs.ErrInvalidArgument, "multipart body: %v", err)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		if err := fn(part); err != nil {
			return err
		}
		part.Close()
	}
}

// sandboxID gives a clear error for an envd handler reached without a
// target, which only a wiring mistake can cause.
func sandboxID(ctx context.Context) (string, error) {
	t := targetOf(ctx)
	if t.id == "" {
		return "", fmt.Errorf("envd request without a sandbox")
	}
	return t.id, nil
}
