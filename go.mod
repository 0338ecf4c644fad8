module github.com/hutch-dev/hutch

go 1.26.0

require (
	github.com/containerd/cgroups/v3 v3.1.3
	github.com/creack/pty v1.1.24
	github.com/elastic/go-seccomp-bpf v1.6.0
	github.com/google/go-containerregistry v0.22.1
	github.com/spf13/cobra v1.10.2
	golang.org/x/net v0.41.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/moby/sys/userns v0.1.0 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	golang.org/x/sync v0.22.0 // indirect
)
