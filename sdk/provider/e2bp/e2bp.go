// Package e2bp is the provider.Provider of E2B's API: the REST control API
// (X-API-KEY) and each sandbox's envd (connect-rpc process and filesystem
// services, JSON, plus /files). It drives E2B's cloud, or hutch's own E2B
// endpoint (`hutch serve --listen`), with the same code.
package e2bp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/hutch-dev/hutch/internal/e2b/envdpb/filesystem"
	"github.com/hutch-dev/hutch/internal/e2b/envdpb/filesystem/filesystempbconnect"
	processpb "github.com/hutch-dev/hutch/internal/e2b/envdpb/process"
	"github.com/hutch-dev/hutch/internal/e2b/envdpb/process/processpbconnect"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/sdk/provider"
)

// envdPort is the port envd listens on in every E2B sandbox.
const envdPort = "49983"

// Config says where E2B is. APIKey is required; the rest default as the
// e2b SDK's do.
type Config struct {
	APIKey string
	// APIURL is the control API (default https://api.<Domain>).
	APIURL string
	// SandboxURL, when set, reaches every sandbox's envd at one URL, the
	// sandbox named in a header (hutch's E2B endpoint serves this). Empty:
	// https://49983-<id>.<Domain>.
	SandboxURL string
	Domain     string // default e2b.app
	HTTPClient *http.Client
}

// FromEnv reads the e2b SDK's variables: E2B_API_KEY, E2B_API_URL,
// E2B_SANDBOX_URL and E2B_DOMAIN.
func FromEnv() Config {
	return Config{APIKey: os.Getenv("E2B_API_KEY"), APIURL: os.Getenv("E2B_API_URL"),
		SandboxURL: os.Getenv("E2B_SANDBOX_URL"), Domain: os.Getenv("E2B_DOMAIN")}
}

// Provider drives an E2B API.
type Provider struct {
	cfg Config
	hc  *http.Client
}

var (
	_ provider.Provider = (*Provider)(nil)
	_ provider.Sandbox  = (*Sandbox)(nil)
)

// New makes the provider.
func New(cfg Config) (*Provider, error) {
	if cfg.APIKey == "" {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "e2bp: an API key is required (E2B_API_KEY)")
	}
	if cfg.Domain == "" {
		cfg.Domain = "e2b.app"
	}
	if cfg.APIURL == "" {
		cfg.APIURL = "https://api." + cfg.Domain
	}
	cfg.APIURL = strings.TrimSuffix(cfg.APIURL, "/")
	cfg.SandboxURL = strings.TrimSuffix(cfg.SandboxURL, "/")
	hc := cfg.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Provider{cfg: cfg, hc: hc}, nil
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "e2b" }

// apiErr turns an E2B error answer into an error with hutch's identity for
// its status.
func apiErr(status int, body []byte) error {
	var e struct {
		Message string `json:"message"`
	}
	_ = json.Unmarshal(body, &e)
	msg := e.Message
	if msg == "" {
		msg = strings.TrimSpace(string(body))
	}
	return errdefs.New(classOf(status), "e2b: %d: %s", status, msg)
}

func classOf(status int) error {
	switch status {
	case http.StatusBadRequest:
		return errdefs.ErrInvalidArgument
	case http.StatusUnauthorized:
		return errdefs.ErrUnauthenticated
	case http.StatusForbidden:
		return errdefs.ErrPermissionDenied
	case http.StatusNotFound:
		return errdefs.ErrNotFound
	case http.StatusConflict:
		return errdefs.ErrConflict
	case http.StatusPreconditionFailed:
		return errdefs.ErrFailedPrecondition
	case http.StatusRequestEntityTooLarge:
		return errdefs.ErrTooLarge
	case http.StatusTooManyRequests, http.StatusInsufficientStorage:
		return errdefs.ErrResourceExhausted
	case http.StatusNotImplemented:
		return errdefs.ErrNotImplemented
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return errdefs.ErrUnavailable
	case http.StatusGatewayTimeout:
		return errdefs.ErrDeadlineExceeded
	}
	return errors.New("unexpected status")
}

// call sends one control request; out, when set, gets the JSON answer.
func (p *Provider) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.cfg.APIURL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-KEY", p.cfg.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.hc.Do(req)
	if err != nil {
		return fmt.Errorf("e2b: %w: %w", errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return fmt.Errorf("e2b: %w: %w", errdefs.ErrUnavailable, err)
	}
	if resp.StatusCode >= 300 {
		return apiErr(resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("e2b: answer to %s %s: %w", method, path, err)
		}
	}
	return nil
}

// sandboxInfo is what create and connect answer.
type sandboxInfo struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
	Domain          string `json:"domain"`
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, o provider.CreateOptions) (provider.Sandbox, error) {
	body := map[string]any{"templateID": o.Template, "metadata": o.Metadata, "envVars": o.Env}
	if o.Template == "" {
		body["templateID"] = "base"
	}
	if o.Timeout > 0 {
		body["timeout"] = int64((o.Timeout + time.Second - 1) / time.Second)
	}
	var info sandboxInfo
	if err := p.call(ctx, http.MethodPost, "/v2/sandboxes", body, &info); err != nil {
		return nil, err
	}
	return p.sandbox(info), nil
}

// Connect implements provider.Provider: E2B's connect, which resumes a
// paused sandbox; 404 means it is gone.
func (p *Provider) Connect(ctx context.Context, id string) (provider.Sandbox, error) {
	var info sandboxInfo
	if err := p.call(ctx, http.MethodPost, "/v2/sandboxes/"+url.PathEscape(id)+"/connect", map[string]any{}, &info); err != nil {
		return nil, err
	}
	return p.sandbox(info), nil
}

// Suspend implements provider.Provider: E2B's pause. One already paused is
// fine.
func (p *Provider) Suspend(ctx context.Context, id string) error {
	err := p.call(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", map[string]any{}, nil)
	if errors.Is(err, errdefs.ErrConflict) {
		return nil
	}
	return err
}

// Destroy implements provider.Provider.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	err := p.call(ctx, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, nil)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	return err
}

// Sandbox is an E2B sandbox reached through its envd.
type Sandbox struct {
	id   string
	url  string
	hc   *http.Client
	proc processpbconnect.ProcessClient
	fs   filesystempbconnect.FilesystemClient
}

// envdHeaders adds what every envd request carries: the access token and,
// for a shared sandbox URL, which sandbox and port.
type envdHeaders struct {
	base http.RoundTripper
	hdr  http.Header
}

func (e envdHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range e.hdr {
		r.Header[k] = v
	}
	return e.base.RoundTrip(r)
}

func (p *Provider) sandbox(info sandboxInfo) *Sandbox {
	domain := info.Domain
	if domain == "" {
		domain = p.cfg.Domain
	}
	u := p.cfg.SandboxURL
	if u == "" {
		u = "https://" + envdPort + "-" + info.SandboxID + "." + domain
	}
	hdr := http.Header{}
	hdr.Set("E2b-Sandbox-Id", info.SandboxID)
	hdr.Set("E2b-Sandbox-Port", envdPort)
	if info.EnvdAccessToken != "" {
		hdr.Set("X-Access-Token", info.EnvdAccessToken)
	}
	base := p.hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc := &http.Client{Transport: envdHeaders{base: base, hdr: hdr}}
	return &Sandbox{id: info.SandboxID, url: u, hc: hc,
		proc: processpbconnect.NewProcessClient(hc, u, connect.WithProtoJSON()),
		fs:   filesystempbconnect.NewFilesystemClient(hc, u, connect.WithProtoJSON())}
}

// ID implements provider.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// rpcErr gives a connect error hutch's identity for its code.
func rpcErr(err error) error {
	if err == nil {
		return nil
	}
	class := map[connect.Code]error{
		connect.CodeInvalidArgument: errdefs.ErrInvalidArgument, connect.CodeNotFound: errdefs.ErrNotFound,
		connect.CodeAlreadyExists: errdefs.ErrAlreadyExists, connect.CodePermissionDenied: errdefs.ErrPermissionDenied,
		connect.CodeUnauthenticated: errdefs.ErrUnauthenticated, connect.CodeFailedPrecondition: errdefs.ErrFailedPrecondition,
		connect.CodeResourceExhausted: errdefs.ErrResourceExhausted, connect.CodeUnimplemented: errdefs.ErrNotImplemented,
		connect.CodeUnavailable: errdefs.ErrUnavailable, connect.CodeDeadlineExceeded: errdefs.ErrDeadlineExceeded,
	}[connect.CodeOf(err)]
	if class == nil {
		return fmt.Errorf("e2b envd: %w", err)
	}
	return fmt.Errorf("e2b envd: %w: %w", class, err)
}

// Exec implements provider.Sandbox: the command runs as envd runs the
// SDK's, `/bin/bash -l -c CMD`; a timeout is the request's deadline, which
// envd enforces by killing the command.
func (s *Sandbox) Exec(ctx context.Context, cmd string, o provider.ExecOptions) (provider.ExecResult, error) {
	cctx := ctx
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	cfg := &processpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}, Envs: o.Env}
	if o.Cwd != "" {
		cfg.Cwd = &o.Cwd
	}
	withStdin := o.Stdin != nil
	stream, err := s.proc.Start(cctx, connect.NewRequest(&processpb.StartRequest{Process: cfg, Stdin: &withStdin}))
	if err != nil {
		return provider.ExecResult{}, rpcErr(err)
	}
	defer stream.Close()
	var res provider.ExecResult
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().GetEvent().(type) {
		case *processpb.ProcessEvent_Start:
			if withStdin {
				if err := s.feed(ctx, ev.Start.GetPid(), o.Stdin); err != nil {
					return res, err
				}
			}
		case *processpb.ProcessEvent_Data:
			s.output(&res, ev.Data, o.OnData)
		case *processpb.ProcessEvent_End:
			if ev.End.GetExited() {
				code := int(ev.End.GetExitCode())
				res.ExitCode = &code
			}
		}
	}
	if err := stream.Err(); err != nil {
		if connect.CodeOf(err) == connect.CodeDeadlineExceeded && o.Timeout > 0 && ctx.Err() == nil {
			res.TimedOut = true
			return res, nil
		}
		return res, rpcErr(err)
	}
	return res, nil
}

func (s *Sandbox) output(res *provider.ExecResult, d *processpb.ProcessEvent_DataEvent, fn func(provider.Stream, []byte)) {
	stream, data := provider.Stdout, d.GetStdout()
	switch {
	case d.GetStderr() != nil:
		stream, data = provider.Stderr, d.GetStderr()
		res.Stderr = append(res.Stderr, data...)
	case d.GetPty() != nil:
		data = d.GetPty()
		res.Stdout = append(res.Stdout, data...)
	default:
		res.Stdout = append(res.Stdout, data...)
	}
	if fn != nil && len(data) > 0 {
		fn(stream, data)
	}
}

// feed writes a command's whole stdin and closes it.
func (s *Sandbox) feed(ctx context.Context, pid uint32, data []byte) error {
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
	for len(data) > 0 {
		n := min(len(data), 64<<10)
		_, err := s.proc.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel,
			Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: data[:n]}}}))
		if err != nil {
			return rpcErr(err)
		}
		data = data[n:]
	}
	_, err := s.proc.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel}))
	return rpcErr(err)
}

// ReadFile implements provider.Sandbox.
func (s *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/files?path="+url.QueryEscape(path), nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("e2b envd: %w: %w", errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("e2b envd: %w: %w", errdefs.ErrUnavailable, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, apiErr(resp.StatusCode, data)
	}
	return data, nil
}

// WriteFile implements provider.Sandbox: a multipart upload whose file
// name is the path, which every envd version takes.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, err := mw.CreateFormFile("file", path)
	if err == nil {
		_, err = fw.Write(data)
	}
	if err == nil {
		err = mw.Close()
	}
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/files?path="+url.QueryEscape(path), &body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := s.hc.Do(req)
	if err != nil {
		return fmt.Errorf("e2b envd: %w: %w", errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return apiErr(resp.StatusCode, raw)
	}
	return nil
}

// Mkdir implements provider.Sandbox.
func (s *Sandbox) Mkdir(ctx context.Context, path string) error {
	_, err := s.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: path}))
	if connect.CodeOf(err) == connect.CodeAlreadyExists {
		return nil
	}
	return rpcErr(err)
}

func fileInfo(e *fspb.EntryInfo) provider.FileInfo {
	fi := provider.FileInfo{Name: e.GetName(), Path: e.GetPath(), Size: e.GetSize(),
		IsDir: e.GetType() == fspb.FileType_FILE_TYPE_DIRECTORY, ModTime: e.GetModifiedTime().AsTime(),
		Mode: fs.FileMode(e.GetMode()).Perm()}
	return fi
}

// Stat implements provider.Sandbox.
func (s *Sandbox) Stat(ctx context.Context, path string) (provider.FileInfo, error) {
	r, err := s.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: path}))
	if err != nil {
		return provider.FileInfo{}, rpcErr(err)
	}
	return fileInfo(r.Msg.GetEntry()), nil
}

// ReadDir implements provider.Sandbox.
func (s *Sandbox) ReadDir(ctx context.Context, path string) ([]provider.FileInfo, error) {
	r, err := s.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: path, Depth: 1}))
	if err != nil {
		return nil, rpcErr(err)
	}
	out := make([]provider.FileInfo, 0, len(r.Msg.GetEntries()))
	for _, e := range r.Msg.GetEntries() {
		out = append(out, fileInfo(e))
	}
	return out, nil
}

// Exists implements provider.Sandbox.
func (s *Sandbox) Exists(ctx context.Context, path string) (bool, error) {
	_, err := s.Stat(ctx, path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, errdefs.ErrNotFound):
		return false, nil
	}
	return false, err
}

// Remove implements provider.Sandbox.
func (s *Sandbox) Remove(ctx context.Context, path string) error {
	_, err := s.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: path}))
	if connect.CodeOf(err) == connect.CodeNotFound {
		return nil
	}
	return rpcErr(err)
}
