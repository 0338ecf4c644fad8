// Package processpbconnect holds the connect-go client and handler generated
// (protoc-gen-connect-go) from process.proto; see package envdpb for how to
// regenerate them.
package processpbconnect
