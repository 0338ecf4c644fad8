// Package filesystempb holds the messages generated (protoc-gen-go) from
// filesystem.proto, hutch's definition of envd's filesystem service; see package envdpb
// for how to regenerate them.
package filesystempb
