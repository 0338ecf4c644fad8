package hutch

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/hutch-dev/hutch/api"
)

// A template is a named recipe of the caller's tenant — a base, files to
// seed, host trees to copy in (local socket only), environment and setup
// commands — prepared once into a read-only layer that every sandbox made
// from it stacks, so those start as fast as any other. A warm pool keeps
// some of them made ahead. Snapshot turns a sandbox into a template; Fork
// copies a sandbox's filesystem into new sandboxes at once.

// TemplateDefinition is what a template is made of.
type TemplateDefinition struct {
	Base   string            `json:"base,omitempty"`  // host (default), dir:/path or oci:/path (local socket only)
	Setup  []string          `json:"setup,omitempty"` // commands run in order; the first that fails fails the build
	Files  []TemplateFile    `json:"files,omitempty"`
	Mounts []TemplateMount   `json:"mounts,omitempty"`
	Env    map[string]string `json:"env,omitempty"` // for setup and every sandbox from the template
	Cwd    string            `json:"cwd,omitempty"`
	Limits Limits            `json:"limits"`
}

// TemplateFile is a file seeded into a template: relative paths are under
// /workspace, ~/ is /root/.
type TemplateFile struct {
	Path    string      `json:"path"`
	Content []byte      `json:"content,omitempty"`
	Mode    fs.FileMode `json:"mode,omitempty"` // default 0644
}

// TemplateMount is a host directory copied into the template at Path when
// it is built (local socket only).
type TemplateMount struct {
	Path   string `json:"path"`
	Source string `json:"source"`
}

// TemplateFileInfo describes a seeded file of a template.
type TemplateFileInfo struct {
	Path   string      `json:"path"`
	Mode   fs.FileMode `json:"mode"`
	Size   int64       `json:"size"`
	SHA256 string      `json:"sha256"`
}

// TemplateBuild is the outcome of a template's last build.
type TemplateBuild struct {
	State      string    `json:"state"` // ready or failed
	Generation string    `json:"generation,omitempty"`
	Error      string    `json:"error,omitempty"`
	Log        string    `json:"log,omitempty"` // the tail of the setup output, when it failed
	At         time.Time `json:"at"`
}

// Template statuses.
const (
	TemplateNone     = "none"
	TemplateBuilding = "building"
	TemplateReady    = "ready"
	TemplateFailed   = "failed"
)

// Template is a template as last seen.
type Template struct {
	Name       string             `json:"name"`
	Tenant     string             `json:"tenant,omitempty"` // shown on the local socket
	Kind       string             `json:"kind"`             // recipe or snapshot
	Base       string             `json:"base"`
	Setup      []string           `json:"setup,omitempty"`
	Files      []TemplateFileInfo `json:"files,omitempty"`
	Mounts     []TemplateMount    `json:"mounts,omitempty"`
	Env        map[string]string  `json:"env,omitempty"`
	Cwd        string             `json:"cwd,omitempty"`
	Limits     Limits             `json:"limits"`
	SnapshotOf string             `json:"snapshot_of,omitempty"`
	Generation string             `json:"generation,omitempty"` // current; "" until built
	Status     string             `json:"status"`
	LastBuild  *TemplateBuild     `json:"last_build,omitempty"`
	PoolSize   int                `json:"pool_size"`
	PoolReady  int                `json:"pool_ready"`
	CreatedAt  time.Time          `json:"created_at"`
	UpdatedAt  time.Time          `json:"updated_at"`
}

func fromAPITemplate(t api.Template) *Template {
	out := &Template{Name: t.Name, Tenant: t.Tenant, Kind: string(t.Kind), Base: t.Base, Setup: t.Setup, Env: t.Env,
		Cwd: t.Cwd, Limits: Limits{MemoryMiB: t.Limits.MemoryMb, CPUMillis: t.Limits.CpuMillis, Pids: t.Limits.Pids},
		SnapshotOf: t.SnapshotOf, Generation: t.Generation, Status: t.Status, PoolSize: t.Pool.Size, PoolReady: t.Pool.Ready,
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
	for _, f := range t.Files {
		out.Files = append(out.Files, TemplateFileInfo{Path: f.Path, Mode: templateMode(f.Mode), Size: f.Size, SHA256: f.Sha256})
	}
	for _, m := range t.Mounts {
		out.Mounts = append(out.Mounts, TemplateMount{Path: m.Path, Source: m.Source})
	}
	if b := t.LastBuild; b != nil {
		out.LastBuild = &TemplateBuild{State: b.State, Generation: b.Generation, Error: b.Error, Log: b.Log, At: b.At}
	}
	return out
}

// templateMode reads the octal mode the API shows (e.g. 0644, 4755).
func templateMode(s string) fs.FileMode {
	n, _ := strconv.ParseUint(s, 8, 32)
	mode := fs.FileMode(n & 0o777)
	for bit, m := range map[uint64]fs.FileMode{0o4000: fs.ModeSetuid, 0o2000: fs.ModeSetgid, 0o1000: fs.ModeSticky} {
		if n&bit != 0 {
			mode |= m
		}
	}
	return mode
}

func toAPIDefinition(d TemplateDefinition) api.TemplateDefinition {
	out := api.TemplateDefinition{Base: d.Base, Setup: d.Setup, Env: d.Env, Cwd: d.Cwd,
		Limits: api.Limits{MemoryMb: d.Limits.MemoryMiB, CpuMillis: d.Limits.CPUMillis, Pids: d.Limits.Pids}}
	for _, f := range d.Files {
		af := api.TemplateFile{Path: f.Path, Content: string(f.Content)}
		if !utf8.Valid(f.Content) {
			af.Content, af.Encoding = base64.StdEncoding.EncodeToString(f.Content), api.TemplateFileEncodingBase64
		}
		if f.Mode != 0 {
			af.Mode = modeString(f.Mode)
		}
		out.Files = append(out.Files, af)
	}
	for _, m := range d.Mounts {
		out.Mounts = append(out.Mounts, api.TemplateMount{Path: m.Path, Source: m.Source})
	}
	return out
}

func (c *Client) template(t *api.Template, err error) (*Template, error) {
	if err != nil {
		return nil, err
	}
	if t == nil {
		return nil, protocolError("no template in the body")
	}
	return fromAPITemplate(*t), nil
}

// PutTemplate creates or replaces the template name. Nothing is built yet;
// a changed recipe makes a new generation on its next build.
func (c *Client) PutTemplate(ctx context.Context, name string, def TemplateDefinition) (*Template, error) {
	r, err := c.api.PutTemplateWithResponse(ctx, name, toAPIDefinition(def))
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	return c.template(r.JSON200, nil)
}

// GetTemplate returns the template name. Another tenant's is ErrNotFound.
func (c *Client) GetTemplate(ctx context.Context, name string) (*Template, error) {
	r, err := c.api.GetTemplateWithResponse(ctx, name)
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	return c.template(r.JSON200, nil)
}

// ListTemplates lists the tenant's templates (on the local socket, every
// tenant's).
func (c *Client) ListTemplates(ctx context.Context) ([]Template, error) {
	r, err := c.api.ListTemplatesWithResponse(ctx)
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	l, err := must(r.JSON200)
	if err != nil {
		return nil, err
	}
	out := make([]Template, 0, len(l.Templates))
	for _, t := range l.Templates {
		out = append(out, *fromAPITemplate(t))
	}
	return out, nil
}

// DeleteTemplate deletes the template name and empties its pool;
// sandboxes made from it keep running.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	r, err := c.api.DeleteTemplateWithResponse(ctx, name)
	return c.check(r, err)
}

// SetTemplatePool keeps size sandboxes of the template name made ahead (0
// empties the pool).
func (c *Client) SetTemplatePool(ctx context.Context, name string, size int) (*Template, error) {
	r, err := c.api.SetTemplatePoolWithResponse(ctx, name, api.PoolRequest{Size: size})
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	return c.template(r.JSON200, nil)
}

// BuildEvent is a step of a template build or output of its setup.
type BuildEvent struct {
	Type string // "step" or "output"
	Step int    // the setup command (1-based); 0 while seeding files
	Cmd  string // step: what runs
	Data []byte // output
}

// BuildTemplate builds the template name's current generation unless it
// is built (or joins the build under way), handing its steps and output to
// watch (which may be nil) as they come. A failed build is an *Error (its
// message ends with the log) matching ErrFailedPrecondition. Cancelling
// ctx stops watching; the build goes on.
func (c *Client) BuildTemplate(ctx context.Context, name string, watch func(BuildEvent)) (*Template, error) {
	resp, err := c.api.BuildTemplate(ctx, name, acceptNDJSON)
	if err := c.checkHTTP(resp, err); err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readBuild(resp.Body, watch)
}

func readBuild(body io.Reader, watch func(BuildEvent)) (*Template, error) {
	dec := json.NewDecoder(body)
	for {
		var ev api.TemplateBuildEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, protocolError("the build stream ended without a done or error event")
			}
			return nil, err
		}
		switch ev.Type {
		case api.TemplateBuildEventTypeDone:
			if ev.Template == nil {
				return nil, protocolError("a done event without the template")
			}
			return fromAPITemplate(*ev.Template), nil
		case api.TemplateBuildEventTypeError:
			if ev.Error == nil {
				return nil, &Error{Code: "internal", Message: "the build failed"}
			}
			return nil, &Error{Code: ev.Error.Code, Message: ev.Error.Message, RequestID: ev.Error.RequestId}
		}
		if watch != nil {
			watch(BuildEvent{Type: string(ev.Type), Step: ev.Step, Cmd: ev.Cmd, Data: ev.Data})
		}
	}
}

// Snapshot freezes the sandbox's filesystem into a new generation of the
// template name (made if missing); its processes run on.
func (s *Sandbox) Snapshot(ctx context.Context, template string) (*Template, error) {
	r, err := s.c.api.SnapshotSandboxWithResponse(ctx, s.ID, api.SnapshotRequest{Template: template})
	if err := s.c.check(r, err); err != nil {
		return nil, err
	}
	return s.c.template(r.JSON201, nil)
}

// ForkOptions describe the sandboxes a fork makes.
type ForkOptions struct {
	Count    int // default 1, at most 16
	Labels   map[string]string
	Metadata map[string]string
}

// Fork makes new sandboxes that start from this one's filesystem as it is
// now (no processes), with its settings. All are made or none.
func (s *Sandbox) Fork(ctx context.Context, o ForkOptions) ([]*Sandbox, error) {
	r, err := s.c.api.ForkSandboxWithResponse(ctx, s.ID, api.ForkRequest{Count: o.Count, Labels: o.Labels, Metadata: o.Metadata})
	if err := s.c.check(r, err); err != nil {
		return nil, err
	}
	l, err := must(r.JSON201)
	if err != nil {
		return nil, err
	}
	out := make([]*Sandbox, 0, len(l.Sandboxes))
	for _, sb := range l.Sandboxes {
		x := s.c.fromAPISandbox(sb)
		out = append(out, &x)
	}
	return out, nil
}
