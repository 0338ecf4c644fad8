package mcp

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"io/fs"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hutch-dev/hutch/internal/errdefs"
	hutch "github.com/hutch-dev/hutch/sdk"
)

// maxFileBytes bounds what read_file returns: a model's context is the
// destination, and base64 in JSON triples a binary's size in tokens.
const maxFileBytes = 4 << 20

// maxWaitSeconds bounds read_process_output's wait, which holds a request
// (and, over HTTP, a connection) open.
const maxWaitSeconds = 300.0

// maxListed bounds list_sandboxes, which walks every page.
const maxListed = 1000

// tools holds the client every tool acts through.
type tools struct{ c *hutch.Client }

func (t *tools) register(s *mcp.Server) {
	add(s, "create_sandbox", "Create and start a sandbox (an isolated Linux machine rooted at /workspace). "+
		"Returns its id, which every other tool takes.", t.create)
	add(s, "list_sandboxes", "List the sandboxes you can see, oldest first.", t.list)
	add(s, "set_network", "Replace a sandbox's network policy; new connections follow it at once. "+
		"deny-all: loopback only; allow-all: the internet (not private, link-local or host addresses); "+
		"allow-list: only what allow names (names, *.domain, IPs, CIDRs, with :PORT,PORT).", t.setNetwork)
	add(s, "destroy_sandbox", "Destroy a sandbox and everything in it. Destroying one already destroyed succeeds.", t.destroy)
	add(s, "run_command", "Run a shell command (sh -c) in a sandbox and wait for it. A non-zero exit is a "+
		"result, not an error; on timeout the command is killed, exit_code is null and timed_out is true.", t.run)
	add(s, "start_process", "Start a shell command in the background. It runs until it exits or is killed; "+
		"read its output with read_process_output.", t.startProcess)
	add(s, "read_process_output", "Read a background process's output from a sequence number on, and whether "+
		"it is still running. Pass next_seq back as from_seq to read only what is new.", t.readOutput)
	add(s, "kill_process", "Send a signal (default SIGKILL) to a background process and its children.", t.kill)
	add(s, "read_file", "Read a file from a sandbox. Text comes back as is; other bytes as base64.", t.readFile)
	add(s, "write_file", "Write a file in a sandbox atomically, creating its parent directories.", t.writeFile)
	add(s, "list_files", "List a directory in a sandbox.", t.listFiles)
	add(s, "remove_file", "Remove a file, or a directory with recursive.", t.removeFile)
}

// add registers a tool whose input schema is inferred from In and then
// tightened (ids and paths must not be empty, numbers not negative).
func add[In, Out any](s *mcp.Server, name, desc string, h func(context.Context, In) (Out, error)) {
	tool := &mcp.Tool{Name: name, Description: desc, InputSchema: inputSchema[In]()}
	mcp.AddTool(s, tool, func(ctx context.Context, _ *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		out, err := h(ctx, in)
		return nil, out, asToolError(err)
	})
}

// schemas keeps each input type's schema (reflect.Type → *jsonschema.Schema),
// so a server made per request hands the SDK's SchemaCache the same
// pointer every time and the inference runs once.
var schemas sync.Map

func inputSchema[In any]() *jsonschema.Schema {
	key := reflect.TypeFor[In]()
	if s, ok := schemas.Load(key); ok {
		return s.(*jsonschema.Schema)
	}
	s, err := jsonschema.For[In](nil)
	if err != nil {
		panic("mcp: input schema of " + key.String() + ": " + err.Error()) // a programming error, caught by every test
	}
	tighten(s)
	actual, _ := schemas.LoadOrStore(key, s)
	return actual.(*jsonschema.Schema)
}

// tighten adds the bounds the Go types cannot say.
func tighten(s *jsonschema.Schema) {
	one, zero := 1, 0.0
	for name, p := range s.Properties {
		switch {
		case name == "sandbox_id" || name == "process_id" || name == "cmd" || name == "path" && contains(s.Required, name):
			p.MinLength = &one
		case p.Type == "integer" || p.Type == "number":
			p.Minimum = &zero
		}
	}
	if p := s.Properties["wait_seconds"]; p != nil {
		most := maxWaitSeconds
		p.Maximum = &most
	}
	if p := s.Properties["encoding"]; p != nil {
		p.Enum = []any{"utf-8", "base64"}
	}
	if p := s.Properties["network"]; p != nil {
		p.Enum = []any{"deny-all", "allow-all", "allow-list"}
	}
	if p := s.Properties["state"]; p != nil {
		p.Enum = []any{"creating", "running", "paused", "suspended", "retired", "destroyed", "failed"}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Sandboxes.

type createIn struct {
	ID             string            `json:"id,omitempty" jsonschema:"the sandbox id to use (letters, digits, - and _); chosen for you when empty"`
	Template       string            `json:"template,omitempty" jsonschema:"a template to start from (see hutch template build)"`
	Base           string            `json:"base,omitempty" jsonschema:"the root filesystem: host (default); dir:/path and oci:/path only on the local socket"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables for every command in the sandbox"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"the default working directory (default /workspace)"`
	Labels         map[string]string `json:"labels,omitempty" jsonschema:"labels to find the sandbox by"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"destroy the sandbox after this many seconds of running time; 0 = no limit"`
	Network        string            `json:"network,omitempty" jsonschema:"network access: deny-all (the default: loopback only), allow-all (the internet, not private or host addresses), or allow-list (only allow)"`
	Allow          []string          `json:"allow,omitempty" jsonschema:"with allow-list: what the sandbox may reach, e.g. api.github.com or *.npmjs.org (HTTP and HTTPS), pypi.org:443, 203.0.113.0/24:5432"`
}

// sandboxOut is what the tools say about a sandbox.
type sandboxOut struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Network   string            `json:"network"`
	Reason    string            `json:"reason,omitempty"`
	Base      string            `json:"base"`
	Template  string            `json:"template,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
}

func toSandboxOut(sb *hutch.Sandbox) sandboxOut {
	return sandboxOut{ID: sb.ID, State: string(sb.State), Network: string(sb.NetworkMode), Reason: sb.Reason,
		Base: sb.Base, Template: sb.Template, Cwd: sb.Cwd, Labels: sb.Labels, CreatedAt: sb.CreatedAt}
}

func (t *tools) create(ctx context.Context, in createIn) (sandboxOut, error) {
	o := hutch.CreateOptions{ID: in.ID, Template: in.Template, Base: in.Base, Env: in.Env,
		Cwd: in.Cwd, Labels: in.Labels, Timeout: time.Duration(in.TimeoutSeconds) * time.Second}
	if in.Network != "" || len(in.Allow) > 0 {
		p, err := policy(in.Network, in.Allow, nil)
		if err != nil {
			return sandboxOut{}, err
		}
		o.Network = &p
	}
	sb, err := t.c.Create(ctx, o)
	if err != nil {
		return sandboxOut{}, err
	}
	return toSandboxOut(sb), nil
}

type listIn struct {
	State  string            `json:"state,omitempty" jsonschema:"only sandboxes in this state"`
	Labels map[string]string `json:"labels,omitempty" jsonschema:"only sandboxes carrying all of these labels"`
}

type listOut struct {
	Sandboxes []sandboxOut `json:"sandboxes"`
	Truncated bool         `json:"truncated,omitempty"`
}

func (t *tools) list(ctx context.Context, in listIn) (listOut, error) {
	o := hutch.ListOptions{Labels: in.Labels}
	if in.State != "" {
		o.States = []hutch.State{hutch.State(in.State)}
	}
	out := listOut{Sandboxes: []sandboxOut{}}
	for sb, err := range t.c.All(ctx, o) {
		if err != nil {
			return listOut{}, err
		}
		if len(out.Sandboxes) == maxListed {
			out.Truncated = true
			break
		}
		out.Sandboxes = append(out.Sandboxes, toSandboxOut(&sb))
	}
	return out, nil
}

type sandboxIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
}

type destroyOut struct {
	ID        string `json:"id"`
	Destroyed bool   `json:"destroyed"`
}

func (t *tools) destroy(ctx context.Context, in sandboxIn) (destroyOut, error) {
	if err := t.c.Delete(ctx, in.SandboxID); err != nil {
		return destroyOut{}, err
	}
	return destroyOut{ID: in.SandboxID, Destroyed: true}, nil
}

// Network.

type setNetworkIn struct {
	SandboxID string   `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Network   string   `json:"network" jsonschema:"deny-all (loopback only), allow-all (the internet, not private or host addresses), or allow-list (only allow)"`
	Allow     []string `json:"allow,omitempty" jsonschema:"with allow-list: what the sandbox may reach, e.g. api.github.com or *.npmjs.org (HTTP and HTTPS), pypi.org:443, 203.0.113.0/24:5432"`
	Deny      []string `json:"deny,omitempty" jsonschema:"IPs or CIDRs refused whatever else allows"`
}

type networkOut struct {
	SandboxID string   `json:"sandbox_id"`
	Network   string   `json:"network"`
	Allow     []string `json:"allow,omitempty"`
	Deny      []string `json:"deny,omitempty"`
}

// setNetwork replaces a sandbox's policy live. Credentials are not on
// offer here: their values would pass through the model's context.
func (t *tools) setNetwork(ctx context.Context, in setNetworkIn) (networkOut, error) {
	p, err := policy(in.Network, in.Allow, in.Deny)
	if err != nil {
		return networkOut{}, err
	}
	got, err := t.c.SetNetwork(ctx, in.SandboxID, p)
	if err != nil {
		return networkOut{}, err
	}
	out := networkOut{SandboxID: in.SandboxID, Network: string(got.Mode), Deny: got.Deny}
	for _, r := range got.Allow {
		out.Allow = append(out.Allow, ruleText(r))
	}
	return out, nil
}

// policy builds a policy from a mode (empty: allow-list with rules,
// deny-all without) and the short forms of its rules.
func policy(mode string, allow, deny []string) (hutch.NetworkPolicy, error) {
	p := hutch.NetworkPolicy{Mode: hutch.NetworkMode(mode), Deny: deny}
	if p.Mode == "" {
		p.Mode = hutch.NetworkDenyAll
		if len(allow) > 0 {
			p.Mode = hutch.NetworkAllowList
		}
	}
	for _, a := range allow {
		r, err := hutch.ParseNetworkRule(a)
		if err != nil {
			return p, fmt.Errorf("allow %w", err)
		}
		p.Allow = append(p.Allow, r)
	}
	return p, nil
}

func ruleText(r hutch.NetworkRule) string {
	s := r.Host + r.CIDR
	if len(r.Ports) > 0 {
		ports := make([]string, len(r.Ports))
		for i, p := range r.Ports {
			ports[i] = strconv.Itoa(p)
		}
		if strings.Contains(s, ":") { // IPv6
			s = "[" + s + "]"
		}
		s += ":" + strings.Join(ports, ",")
	}
	return s
}

// Commands and processes.

type runIn struct {
	SandboxID      string            `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Cmd            string            `json:"cmd" jsonschema:"the command, run with sh -c"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds (default 300, at most 3600)"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"the working directory (default the sandbox's, /workspace)"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables added for this command"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text given to the command on its standard input"`
}

type runOut struct {
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	ExitCode        *int    `json:"exit_code" jsonschema:"the exit code; null when the command was killed (timeout or signal)"`
	Signal          string  `json:"signal,omitempty"`
	TimedOut        bool    `json:"timed_out"`
	StdoutTruncated bool    `json:"stdout_truncated,omitempty"`
	StderrTruncated bool    `json:"stderr_truncated,omitempty"`
	DurationMs      float64 `json:"duration_ms"`
}

func (t *tools) run(ctx context.Context, in runIn) (runOut, error) {
	opts := []hutch.ExecOption{hutch.WithCwd(in.Cwd), hutch.WithEnv(in.Env)}
	if in.TimeoutSeconds > 0 {
		opts = append(opts, hutch.WithTimeout(time.Duration(in.TimeoutSeconds*float64(time.Second))))
	}
	if in.Stdin != "" {
		opts = append(opts, hutch.WithStdin([]byte(in.Stdin)))
	}
	res, err := t.c.Sandbox(in.SandboxID).Exec(ctx, in.Cmd, opts...)
	if err != nil {
		return runOut{}, err
	}
	return runOut{Stdout: string(res.Stdout), Stderr: string(res.Stderr), ExitCode: res.ExitCode,
		Signal: res.Signal, TimedOut: res.TimedOut, StdoutTruncated: res.StdoutTruncated,
		StderrTruncated: res.StderrTruncated, DurationMs: float64(res.Duration) / float64(time.Millisecond)}, nil
}

type startIn struct {
	SandboxID      string            `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Cmd            string            `json:"cmd" jsonschema:"the command, run with sh -c"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"the working directory (default the sandbox's, /workspace)"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables added for this process"`
	Tag            string            `json:"tag,omitempty" jsonschema:"a name to find the process by instead of its id"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty" jsonschema:"kill the process after this many seconds; 0 = never"`
}

type processOut struct {
	ProcessID string `json:"process_id"`
	PID       int    `json:"pid"`
	Tag       string `json:"tag,omitempty"`
}

func (t *tools) startProcess(ctx context.Context, in startIn) (processOut, error) {
	p, err := t.c.Sandbox(in.SandboxID).StartProcess(ctx, in.Cmd, hutch.ProcessOptions{Cwd: in.Cwd, Env: in.Env,
		Tag: in.Tag, Timeout: time.Duration(in.TimeoutSeconds * float64(time.Second))})
	if err != nil {
		return processOut{}, err
	}
	return processOut{ProcessID: p.ID, PID: p.PID, Tag: p.Tag}, nil
}

type outputIn struct {
	SandboxID   string  `json:"sandbox_id" jsonschema:"the sandbox's id"`
	ProcessID   string  `json:"process_id" jsonschema:"the process's id or tag"`
	FromSeq     int64   `json:"from_seq,omitempty" jsonschema:"the first output chunk to return (0 = from the start)"`
	WaitSeconds float64 `json:"wait_seconds,omitempty" jsonschema:"wait up to this many seconds (at most 300) for the process to exit, collecting output meanwhile; 0 = return what there is now"`
}

type outputOut struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	NextSeq  int64  `json:"next_seq" jsonschema:"pass as from_seq to read on from here"`
	Running  bool   `json:"running"`
	ExitCode *int   `json:"exit_code,omitempty" jsonschema:"set once the process has exited with a code"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Lost     int64  `json:"lost,omitempty" jsonschema:"output bytes no longer kept"`
}

func (t *tools) readOutput(ctx context.Context, in outputIn) (outputOut, error) {
	if in.WaitSeconds > maxWaitSeconds { // the schema says so too; this is for clients that skip it
		return outputOut{}, invalid("wait_seconds %g: at most %g", in.WaitSeconds, maxWaitSeconds)
	}
	follow := in.WaitSeconds > 0
	rctx := ctx
	if follow {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, time.Duration(in.WaitSeconds*float64(time.Second)))
		defer cancel()
	}
	var stdout, stderr strings.Builder
	out := outputOut{NextSeq: in.FromSeq, Running: true}
	st, err := t.c.Sandbox(in.SandboxID).ProcessOutput(rctx, in.ProcessID, in.FromSeq, follow, hutch.StreamHandler{
		Stdout: &stdout, Stderr: &stderr,
		OnEvent: func(ev hutch.Event) error {
			if ev.Type == hutch.EventOutput {
				out.NextSeq = ev.Seq + 1
			}
			if ev.Type == hutch.EventExit {
				out.NextSeq = ev.Seq
			}
			return nil
		}})
	// Waiting that ran out is not a failure: the output so far is the answer.
	if err != nil && !(follow && ctx.Err() == nil && rctx.Err() != nil) {
		return outputOut{}, err
	}
	out.Stdout, out.Stderr = stdout.String(), stderr.String()
	if st != nil {
		out.Running, out.ExitCode, out.Signal, out.TimedOut, out.Lost = false, st.ExitCode, st.Signal, st.TimedOut, st.Lost
	}
	return out, nil
}

type killIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	ProcessID string `json:"process_id" jsonschema:"the process's id or tag"`
	Signal    string `json:"signal,omitempty" jsonschema:"the signal: SIGKILL (default), SIGTERM, TERM, 15, …"`
}

type killOut struct {
	ProcessID string `json:"process_id"`
	Signal    string `json:"signal"`
}

func (t *tools) kill(ctx context.Context, in killIn) (killOut, error) {
	sig := in.Signal
	if sig == "" {
		sig = "SIGKILL"
	}
	if err := t.c.Sandbox(in.SandboxID).Signal(ctx, in.ProcessID, sig); err != nil {
		return killOut{}, err
	}
	return killOut{ProcessID: in.ProcessID, Signal: sig}, nil
}

// Files.

type pathIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"the path; relative paths are under /workspace"`
}

type fileOut struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding" jsonschema:"utf-8 for text, base64 for other bytes"`
	Size     int    `json:"size"`
}

func (t *tools) readFile(ctx context.Context, in pathIn) (fileOut, error) {
	data, err := readCapped(ctx, t.c.Sandbox(in.SandboxID), in.Path)
	if err != nil {
		return fileOut{}, err
	}
	out := fileOut{Path: in.Path, Content: string(data), Encoding: "utf-8", Size: len(data)}
	if !utf8.Valid(data) {
		out.Content, out.Encoding = base64.StdEncoding.EncodeToString(data), "base64"
	}
	return out, nil
}

// readCapped reads a file, refusing one over maxFileBytes rather than
// cutting it silently.
func readCapped(ctx context.Context, sb *hutch.Sandbox, path string) ([]byte, error) {
	rc, err := sb.ReadFileStream(ctx, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, maxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxFileBytes {
		return nil, errdefs.New(errdefs.ErrTooLarge, "%s is over %d bytes; read it with run_command (head, split)", path, maxFileBytes)
	}
	return data, nil
}

type writeIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"the path; relative paths are under /workspace"`
	Content   string `json:"content" jsonschema:"the file's content"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"how content is encoded: utf-8 (default) or base64"`
	Mode      string `json:"mode,omitempty" jsonschema:"permission bits in octal, e.g. 0755 (default 0644)"`
}

type writeOut struct {
	Path string `json:"path"`
	Size int    `json:"size"`
}

func (t *tools) writeFile(ctx context.Context, in writeIn) (writeOut, error) {
	data := []byte(in.Content)
	if in.Encoding == "base64" {
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return writeOut{}, invalid("content is not base64: %v", err)
		}
	}
	var mode fs.FileMode
	if in.Mode != "" {
		n, err := strconv.ParseUint(in.Mode, 8, 32)
		if err != nil || n > 0o777 {
			return writeOut{}, invalid("mode %q: want octal permission bits such as 0644", in.Mode)
		}
		mode = fs.FileMode(n)
	}
	if err := t.c.Sandbox(in.SandboxID).WriteFile(ctx, in.Path, data, mode); err != nil {
		return writeOut{}, err
	}
	return writeOut{Path: in.Path, Size: len(data)}, nil
}

type listFilesIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Path      string `json:"path,omitempty" jsonschema:"the directory (default /workspace); relative paths are under /workspace"`
	Depth     int    `json:"depth,omitempty" jsonschema:"how many levels to descend (default 1)"`
	Glob      string `json:"glob,omitempty" jsonschema:"keep only entries whose name matches this pattern, e.g. *.py"`
}

type entryOut struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	Type       string    `json:"type" jsonschema:"file, dir, symlink or other"`
	Size       int64     `json:"size"`
	Mode       string    `json:"mode" jsonschema:"permission bits in octal"`
	LinkTarget string    `json:"link_target,omitempty"`
	ModifiedAt time.Time `json:"modified_at"`
}

type listFilesOut struct {
	Files []entryOut `json:"files"`
}

func (t *tools) listFiles(ctx context.Context, in listFilesIn) (listFilesOut, error) {
	path := in.Path
	if path == "" {
		path = "/workspace"
	}
	files, err := t.c.Sandbox(in.SandboxID).ListFiles(ctx, path, in.Depth, in.Glob)
	if err != nil {
		return listFilesOut{}, err
	}
	out := listFilesOut{Files: make([]entryOut, 0, len(files))}
	for _, f := range files {
		out.Files = append(out.Files, entryOut{Name: f.Name, Path: f.Path, Type: f.Type, Size: f.Size,
			Mode: "0" + strconv.FormatUint(uint64(f.Mode.Perm()), 8), LinkTarget: f.LinkTarget, ModifiedAt: f.ModTime})
	}
	return out, nil
}

type removeIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"the path; relative paths are under /workspace"`
	Recursive bool   `json:"recursive,omitempty" jsonschema:"remove a directory and everything in it"`
	Force     bool   `json:"force,omitempty" jsonschema:"a missing path is no error"`
}

type removeOut struct {
	Path    string `json:"path"`
	Removed bool   `json:"removed"`
}

func (t *tools) removeFile(ctx context.Context, in removeIn) (removeOut, error) {
	err := t.c.Sandbox(in.SandboxID).Remove(ctx, in.Path, hutch.RemoveOptions{Recursive: in.Recursive, Force: in.Force})
	if err != nil {
		return removeOut{}, err
	}
	return removeOut{Path: in.Path, Removed: true}, nil
}
