package mcp

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	hutch "github.com/hutch-dev/hutch/sdk"
)

// filesPrefix starts every file resource's URI. The rest is
// {sandbox id}/files/{absolute path without its leading slash}, so the URI
// mirrors the sandbox's own tree: hutch://sandboxes/demo/files/workspace/a.txt
// is /workspace/a.txt in sandbox demo.
const filesPrefix = "hutch://sandboxes/"

var filesTemplate = &mcp.ResourceTemplate{
	URITemplate: filesPrefix + "{id}/files/{+path}",
	Name:        "sandbox-file",
	Title:       "A file in a sandbox",
	Description: "A file in a sandbox, by absolute path: hutch://sandboxes/ID/files/workspace/main.py is " +
		"/workspace/main.py in sandbox ID. Text comes back as text, other bytes as a blob.",
}

// parseFileURI splits a file resource's URI into sandbox id and absolute
// path; ok is false when the URI is not one.
func parseFileURI(uri string) (id, path string, ok bool) {
	rest, ok := strings.CutPrefix(uri, filesPrefix)
	if !ok {
		return "", "", false
	}
	id, p, ok := strings.Cut(rest, "/files/")
	if !ok || id == "" || p == "" || strings.Contains(id, "/") {
		return "", "", false
	}
	p, err := url.PathUnescape(p)
	if err != nil {
		return "", "", false
	}
	return id, "/" + p, true
}

func (t *tools) readResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	id, path, ok := parseFileURI(uri)
	if !ok {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	data, err := readCapped(ctx, t.c.Sandbox(id), path)
	if errors.Is(err, hutch.ErrNotFound) {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if err != nil {
		return nil, asToolError(err) // its message carries the code, as tool errors do
	}
	rc := &mcp.ResourceContents{URI: uri}
	if utf8.Valid(data) {
		rc.MIMEType, rc.Text = "text/plain; charset=utf-8", string(data)
	} else {
		rc.MIMEType, rc.Blob = http.DetectContentType(data), data
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{rc}}, nil
}
