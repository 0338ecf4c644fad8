package hutch

import (
	"context"
	"iter"
	"time"

	"github.com/hutch-dev/hutch/api"
)

// Sandbox is a sandbox as last seen, and the handle for everything done in
// it. Get refreshes it; Client.Sandbox makes a handle from an id alone.
type Sandbox struct {
	ID             string            `json:"id"`
	State          State             `json:"state"`
	Reason         string            `json:"reason,omitempty"` // why it is in its state (failed, destroyed)
	Base           string            `json:"base"`
	Template       string            `json:"template,omitempty"`
	Generation     string            `json:"generation,omitempty"`  // the template generation it was made from
	ForkedFrom     string            `json:"forked_from,omitempty"` // the sandbox it was forked from
	Env            map[string]string `json:"env,omitempty"`
	Cwd            string            `json:"cwd,omitempty"`
	Hostname       string            `json:"hostname,omitempty"`
	Limits         Limits            `json:"limits"`
	Labels         map[string]string `json:"labels,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	TimeoutSeconds int               `json:"timeout,omitempty"`    // seconds of running time until OnTimeout; 0 = none
	OnTimeout      string            `json:"on_timeout,omitempty"` // destroy or suspend
	// The lifecycle timers in seconds, the daemon's defaults filled in; -1 = never.
	IdleTimeoutSeconds int           `json:"idle_timeout,omitempty"` // idle time until suspended
	RetireAfterSeconds int           `json:"retire_after,omitempty"` // suspended time until retired
	AutoResume         bool          `json:"auto_resume"`            // calls on a paused or suspended sandbox resume it
	TimeUsed           time.Duration `json:"time_used"`              // running time used (what Timeout counts); seconds in JSON
	Archive            *ArchiveInfo  `json:"archive,omitempty"`      // the kept writable layer, once suspended
	NetworkMode        NetworkMode   `json:"network_mode,omitempty"` // Network has the rest of the policy
	CreatedAt          time.Time     `json:"created_at"`
	UpdatedAt          time.Time     `json:"updated_at"`

	c *Client
}

// Client returns the client the handle uses.
func (s *Sandbox) Client() *Client { return s.c }

// Sandbox returns a handle on the sandbox id without asking the daemon;
// only its ID is set.
func (c *Client) Sandbox(id string) *Sandbox { return &Sandbox{ID: id, c: c} }

func (c *Client) fromAPISandbox(s api.Sandbox) Sandbox {
	return Sandbox{ID: s.Id, State: State(s.State), Reason: s.Reason, Base: s.Base, Template: s.Template,
		Generation: s.Generation, ForkedFrom: s.ForkedFrom,
		Env: s.Env, Cwd: s.Cwd, Hostname: s.Hostname, Labels: s.Labels, Metadata: s.Metadata,
		Limits:         Limits{MemoryMiB: s.Limits.MemoryMb, CPUMillis: s.Limits.CpuMillis, Pids: s.Limits.Pids},
		TimeoutSeconds: s.Timeout, OnTimeout: s.OnTimeout, IdleTimeoutSeconds: s.IdleTimeout,
		RetireAfterSeconds: s.RetireAfter, AutoResume: s.AutoResume, TimeUsed: secondsDuration(s.TimeUsed),
		Archive: fromAPIArchive(s.Archive), NetworkMode: NetworkMode(s.NetworkMode),
		CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt, c: c}
}

// CreateOptions describe a new sandbox. The zero value is a sandbox on the
// host base with the daemon's defaults.
type CreateOptions struct {
	ID       string // chosen by the daemon when empty
	Base     string // host (default), dir:/path or oci:/path[#ref]
	Template string
	Env      map[string]string
	Cwd      string
	Hostname string
	Limits   Limits
	Labels   map[string]string
	Metadata map[string]string
	// Timeout is how long the sandbox may run (whole seconds, rounded up;
	// paused and suspended time do not count) before OnTimeout; 0 = no limit.
	Timeout time.Duration
	// OnTimeout is what the timeout does: "destroy" (the default) or
	// "suspend".
	OnTimeout string
	// IdleTimeout suspends the sandbox after this long idle; RetireAfter
	// retires it (archive kept, nothing else) after this long suspended.
	// 0 = the daemon's default (5m and 5h), negative = never.
	IdleTimeout, RetireAfter time.Duration
	// AutoResume says whether calls on a paused or suspended sandbox resume
	// it first (nil = true); with false they fail with ErrConflict.
	AutoResume *bool
	// Network is the sandbox's network policy; nil = deny-all (loopback
	// only).
	Network *NetworkPolicy
}

// Create creates and starts a sandbox.
func (c *Client) Create(ctx context.Context, o CreateOptions) (*Sandbox, error) {
	req := api.CreateSandboxRequest{Id: o.ID, Base: o.Base, Template: o.Template, Env: o.Env, Cwd: o.Cwd,
		Hostname: o.Hostname, Labels: o.Labels, Metadata: o.Metadata, Timeout: ceilSeconds(o.Timeout),
		Limits:    api.Limits{MemoryMb: o.Limits.MemoryMiB, CpuMillis: o.Limits.CPUMillis, Pids: o.Limits.Pids},
		OnTimeout: api.CreateSandboxRequestOnTimeout(o.OnTimeout), IdleTimeout: lifeSeconds(o.IdleTimeout),
		RetireAfter: lifeSeconds(o.RetireAfter), AutoResume: o.AutoResume}
	if o.Network != nil {
		p := toAPIPolicy(*o.Network)
		req.Network = &p
	}
	r, err := c.api.CreateSandboxWithResponse(ctx, req)
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	return c.sandbox(r.JSON201)
}

func (c *Client) sandbox(s *api.Sandbox) (*Sandbox, error) {
	if s == nil {
		return nil, protocolError("no sandbox in the body")
	}
	sb := c.fromAPISandbox(*s)
	return &sb, nil
}

func ceilSeconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}

// Get returns the sandbox id. Another tenant's sandbox is ErrNotFound.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	r, err := c.api.GetSandboxWithResponse(ctx, id)
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	return c.sandbox(r.JSON200)
}

// Refresh reloads s from the daemon.
func (s *Sandbox) Refresh(ctx context.Context) error {
	fresh, err := s.c.Get(ctx, s.ID)
	if err != nil {
		return err
	}
	*s = *fresh
	return nil
}

// Delete destroys the sandbox id; destroying one already destroyed
// succeeds.
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.DeleteBecause(ctx, id, "")
}

// DeleteBecause destroys the sandbox id and keeps why in its record (its
// reason becomes "deleted: why"; at most 200 printable characters).
func (c *Client) DeleteBecause(ctx context.Context, id, why string) error {
	r, err := c.api.DeleteSandboxWithResponse(ctx, id, &api.DeleteSandboxParams{Reason: why})
	return c.check(r, err)
}

// Delete destroys the sandbox.
func (s *Sandbox) Delete(ctx context.Context) error { return s.c.Delete(ctx, s.ID) }

// ListOptions filter and page a listing.
type ListOptions struct {
	States    []State           // any of these (all when empty)
	Labels    map[string]string // all of these
	Limit     int               // per page; the daemon's default (100) when 0
	PageToken string            // from the previous page
}

// List returns one page of sandboxes, oldest first, and the token of the
// next page ("" after the last).
func (c *Client) List(ctx context.Context, o ListOptions) ([]Sandbox, string, error) {
	p := api.ListSandboxesParams{PageToken: o.PageToken}
	if o.Limit != 0 {
		p.Limit = &o.Limit
	}
	for i, st := range o.States {
		if i > 0 {
			p.State += ","
		}
		p.State += string(st)
	}
	for k, v := range o.Labels {
		p.Label = append(p.Label, k+"="+v)
	}
	r, err := c.api.ListSandboxesWithResponse(ctx, &p)
	if err := c.check(r, err); err != nil {
		return nil, "", err
	}
	page, err := must(r.JSON200)
	if err != nil {
		return nil, "", err
	}
	out := make([]Sandbox, 0, len(page.Sandboxes))
	for _, s := range page.Sandboxes {
		out = append(out, c.fromAPISandbox(s))
	}
	return out, page.NextPageToken, nil
}

// All iterates over every sandbox matching o, fetching pages as needed. An
// error ends the iteration with (zero Sandbox, err).
func (c *Client) All(ctx context.Context, o ListOptions) iter.Seq2[Sandbox, error] {
	return func(yield func(Sandbox, error) bool) {
		for {
			page, next, err := c.List(ctx, o)
			if err != nil {
				yield(Sandbox{}, err)
				return
			}
			for _, s := range page {
				if !yield(s, nil) {
					return
				}
			}
			if next == "" {
				return
			}
			o.PageToken = next
		}
	}
}
