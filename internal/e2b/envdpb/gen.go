// Package envdpb holds hutch's own protobuf definitions of the two services
// the e2b SDK calls inside a sandbox (process.Process and
// filesystem.Filesystem) and the Go code generated from them. The generated
// code is committed so that building hutch needs no generator.
package envdpb

// Regenerate (protoc from apt's protobuf-compiler; protoc-gen-go v1.36.12 and
// protoc-gen-connect-go v1.21.1 on PATH):
//go:generate protoc -I . --go_out=. --go_opt=paths=source_relative --connect-go_out=. --connect-go_opt=paths=source_relative process/process.proto filesystem/filesystem.proto
