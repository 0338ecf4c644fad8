// Package api holds hutch's HTTP contract: openapi.yaml, embedded so the
// daemon can serve it, and the types, server interface and client that
// oapi-codegen generates from it (api.gen.go; regenerate with go generate).
package api

import _ "embed"

//go:generate go tool oapi-codegen -config config.yaml openapi.yaml

// Spec is openapi.yaml, served at /v1/openapi.yaml.
//
//go:embed openapi.yaml
var Spec []byte
