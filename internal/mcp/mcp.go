// Package mcp is hutch's MCP server: tools to create, list and destroy
// sandboxes, run commands, drive background processes and work with files,
// and a resource template for a sandbox's files. The tools are written once,
// over the Go SDK's client (package sdk), so the same server runs on stdio
// (`hutch mcp`, talking to a daemon like the other client verbs) and inside
// the daemon at /mcp (streamable HTTP), where its client is an in-process
// transport into the API that acts as the HTTP caller.
package mcp

import (
	"context"
	"errors"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hutch-dev/hutch/internal/errdefs"
	hutch "github.com/hutch-dev/hutch/sdk"
)

// New returns an MCP server whose tools act through c. cache may be nil;
// pass one shared cache when making a server per request.
func New(c *hutch.Client, version string, cache *mcp.SchemaCache) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "hutch", Title: "hutch sandboxes", Version: version},
		&mcp.ServerOptions{Instructions: instructions, SchemaCache: cache})
	t := &tools{c: c}
	t.register(s)
	s.AddResourceTemplate(filesTemplate, t.readResource)
	s.AddReceivingMiddleware(codeArgumentErrors)
	return s
}

const instructions = "hutch runs isolated Linux sandboxes. Create one with create_sandbox, run commands in it " +
	"with run_command (or start_process for long-running ones), move files with read_file/write_file, and " +
	"destroy it with destroy_sandbox when done. Relative paths are under /workspace. Errors start with a " +
	"code such as not_found or invalid_argument."

// Handler serves MCP over streamable HTTP for a daemon. Every POST gets its
// own server (stateless mode: no session outlives its request), whose
// client reaches the API through transportFor(r), which must act as r's
// authenticated caller. Being stateless is what keeps tenants apart: there
// is no session id another caller could present to borrow an identity.
func Handler(transportFor func(*http.Request) http.RoundTripper, version string) http.Handler {
	cache := mcp.NewSchemaCache()
	return mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		c, err := hutch.New("http://hutch", "", hutch.WithHTTPClient(&http.Client{Transport: transportFor(r)}),
			hutch.WithUserAgent("hutch-mcp/"+version))
		if err != nil {
			// A constant, valid URL: this cannot fail; nil answers 400.
			return nil
		}
		return New(c, version, cache)
	}, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true,
		// A client that hangs up (on protocols where the POST is the whole
		// call) ends the call, and so the command it ran, as over the API.
		PropagateRequestCancellation: true})
}

// toolError is a failed tool call; its text starts with the hutch error
// code, so a model (or a client) can tell not_found from invalid_argument.
type toolError struct {
	code string
	msg  string
}

func (e *toolError) Error() string { return e.code + ": " + e.msg }

// asToolError converts err, keeping the daemon's code and message.
func asToolError(err error) error {
	if err == nil {
		return nil
	}
	var te *toolError
	if errors.As(err, &te) {
		return te
	}
	var he *hutch.Error
	if errors.As(err, &he) {
		return &toolError{code: he.Code, msg: he.Message}
	}
	return &toolError{code: errdefs.Code(err), msg: err.Error()}
}

func invalid(format string, args ...any) error {
	return asToolError(errdefs.New(errdefs.ErrInvalidArgument, format, args...))
}

// codeArgumentErrors gives the SDK's own tool errors (arguments that do not
// match the input schema, which it reports before any handler runs) the
// invalid_argument code that every handler error carries. It tells them
// apart by identity: errors from handlers are *toolError.
func codeArgumentErrors(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		r, ok := res.(*mcp.CallToolResult)
		if err != nil || !ok || !r.IsError {
			return res, err
		}
		var te *toolError
		if errors.As(r.GetError(), &te) {
			return res, err
		}
		for _, c := range r.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				tc.Text = "invalid_argument: " + tc.Text
				break
			}
		}
		return res, err
	}
}
