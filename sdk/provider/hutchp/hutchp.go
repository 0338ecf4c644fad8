// Package hutchp is the provider.Provider of hutch's own API, over the Go
// SDK (package hutch).
package hutchp

import (
	"bytes"
	"context"
	"errors"
	"io"

	hutch "github.com/hutch-dev/hutch/sdk"
	"github.com/hutch-dev/hutch/sdk/provider"
)

// Provider drives a hutch daemon.
type Provider struct {
	c *hutch.Client
}

var (
	_ provider.Provider = (*Provider)(nil)
	_ provider.Sandbox  = (*Sandbox)(nil)
)

// New makes the provider on a hutch client (hutch.New or hutch.FromEnv).
func New(c *hutch.Client) *Provider { return &Provider{c: c} }

// Name implements provider.Provider.
func (p *Provider) Name() string { return "hutch" }

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, o provider.CreateOptions) (provider.Sandbox, error) {
	sb, err := p.c.Create(ctx, hutch.CreateOptions{Template: o.Template, Env: o.Env, Metadata: o.Metadata, Timeout: o.Timeout})
	if err != nil {
		return nil, err
	}
	return &Sandbox{sb: sb}, nil
}

// Connect implements provider.Provider: a destroyed or failed sandbox is
// gone (ErrNotFound); a paused or suspended one is resumed.
func (p *Provider) Connect(ctx context.Context, id string) (provider.Sandbox, error) {
	sb, err := p.c.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	switch sb.State {
	case hutch.StateDestroyed, hutch.StateFailed:
		return nil, &goneError{id: id, state: string(sb.State)}
	case hutch.StateRunning:
	default:
		if sb, err = sb.Resume(ctx); err != nil {
			return nil, err
		}
	}
	return &Sandbox{sb: sb}, nil
}

type goneError struct{ id, state string }

func (e *goneError) Error() string { return "sandbox " + e.id + " is " + e.state }
func (e *goneError) Unwrap() error { return provider.ErrNotFound }

// Suspend implements provider.Provider: hutch's suspend (files kept,
// processes not).
func (p *Provider) Suspend(ctx context.Context, id string) error {
	_, err := p.c.Sandbox(id).Suspend(ctx)
	return err
}

// Destroy implements provider.Provider.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	if err := p.c.Delete(ctx, id); err != nil && !errors.Is(err, hutch.ErrNotFound) {
		return err
	}
	return nil
}

// Sandbox is a hutch sandbox as a provider.Sandbox.
type Sandbox struct {
	sb *hutch.Sandbox
}

// ID implements provider.Sandbox.
func (s *Sandbox) ID() string { return s.sb.ID }

// Exec implements provider.Sandbox: a streamed exec, so OnData sees output
// as it comes.
func (s *Sandbox) Exec(ctx context.Context, cmd string, o provider.ExecOptions) (provider.ExecResult, error) {
	var opts []hutch.ExecOption
	if o.Cwd != "" {
		opts = append(opts, hutch.WithCwd(o.Cwd))
	}
	if len(o.Env) > 0 {
		opts = append(opts, hutch.WithEnv(o.Env))
	}
	if o.Timeout > 0 {
		opts = append(opts, hutch.WithTimeout(o.Timeout))
	}
	if o.Stdin != nil {
		opts = append(opts, hutch.WithStdin(o.Stdin))
	}
	var stdout, stderr bytes.Buffer
	h := hutch.StreamHandler{Stdout: tee(&stdout, o.OnData, provider.Stdout), Stderr: tee(&stderr, o.OnData, provider.Stderr)}
	st, err := s.sb.ExecStream(ctx, cmd, h, opts...)
	if err != nil {
		return provider.ExecResult{}, err
	}
	return provider.ExecResult{ExitCode: st.ExitCode, TimedOut: st.TimedOut, Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}, nil
}

type onData struct {
	fn     func(provider.Stream, []byte)
	stream provider.Stream
}

func (w onData) Write(p []byte) (int, error) {
	w.fn(w.stream, bytes.Clone(p))
	return len(p), nil
}

func tee(buf *bytes.Buffer, fn func(provider.Stream, []byte), s provider.Stream) io.Writer {
	if fn == nil {
		return buf
	}
	return io.MultiWriter(buf, onData{fn: fn, stream: s})
}

// ReadFile implements provider.Sandbox.
func (s *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	return s.sb.ReadFile(ctx, path)
}

// WriteFile implements provider.Sandbox.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	return s.sb.WriteFile(ctx, path, data, 0o644)
}

// Mkdir implements provider.Sandbox.
func (s *Sandbox) Mkdir(ctx context.Context, path string) error {
	return s.sb.Mkdir(ctx, path, 0o755)
}

func fileInfo(f hutch.FileInfo) provider.FileInfo {
	return provider.FileInfo{Name: f.Name, Path: f.Path, Size: f.Size, IsDir: f.IsDir(), Mode: f.Mode.Perm(), ModTime: f.ModTime}
}

// Stat implements provider.Sandbox.
func (s *Sandbox) Stat(ctx context.Context, path string) (provider.FileInfo, error) {
	f, err := s.sb.Stat(ctx, path)
	if err != nil {
		return provider.FileInfo{}, err
	}
	return fileInfo(*f), nil
}

// ReadDir implements provider.Sandbox.
func (s *Sandbox) ReadDir(ctx context.Context, path string) ([]provider.FileInfo, error) {
	fs, err := s.sb.ListFiles(ctx, path, 1, "")
	if err != nil {
		return nil, err
	}
	out := make([]provider.FileInfo, 0, len(fs))
	for _, f := range fs {
		out = append(out, fileInfo(f))
	}
	return out, nil
}

// Exists implements provider.Sandbox.
func (s *Sandbox) Exists(ctx context.Context, path string) (bool, error) {
	return s.sb.Exists(ctx, path)
}

// Remove implements provider.Sandbox.
func (s *Sandbox) Remove(ctx context.Context, path string) error {
	return s.sb.Remove(ctx, path, hutch.RemoveOptions{Recursive: true, Force: true})
}
