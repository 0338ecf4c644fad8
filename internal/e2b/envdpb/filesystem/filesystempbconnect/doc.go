// Package filesystempbconnect holds the connect-go client and handler generated
// (protoc-gen-connect-go) from filesystem.proto; see package envdpb for how to
// regenerate them.
package filesystempbconnect
