// Package processpb holds the messages generated (protoc-gen-go) from
// process.proto, hutch's definition of envd's process service; see package envdpb
// for how to regenerate them.
package processpb
