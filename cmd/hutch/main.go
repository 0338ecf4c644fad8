// Command hutch is the whole of hutch in one binary: the daemon (hutch
// serve), the client verbs, and, re-executed by the native backend, the
// init and agent of every sandbox.
package main

import (
	"os"

	"github.com/hutch-dev/hutch/internal/backend/native"
	"github.com/hutch-dev/hutch/internal/cli"
)

func main() {
	if native.IsInit() {
		native.InitMain() // never returns
	}
	os.Exit(cli.Main(os.Args[1:]))
}
