package daemontest

import "github.com/hutch-dev/hutch/internal/sandbox"

func sandboxListAll() sandbox.ListOptions { return sandbox.ListOptions{Limit: 1000} }
