// Package typescript holds the hutch TypeScript client and its framework
// adapters (eve, Rivet's sandbox-adapter, zidane), which are npm code; the
// Go package exists so that `go test ./...` runs their node test suite
// against a real `hutch serve`, in CI like every other test.
package typescript
