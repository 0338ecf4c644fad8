// Package hutch is the Go SDK for hutch, the self-hosted sandbox platform
// for AI agents. It talks to a hutch daemon (hutch serve) over its unix
// socket or over TCP with an API key.
//
// A Client reaches one daemon; a *Sandbox is a handle on one sandbox and
// carries everything done inside it: commands (buffered, streamed, or
// interactive over a WebSocket), background processes, terminals, files and
// tar archives.
//
//	c, err := hutch.FromEnv() // HUTCH_HOST, HUTCH_API_KEY
//	if err != nil { ... }
//	sb, err := c.Create(ctx, hutch.CreateOptions{})
//	if err != nil { ... }
//	defer c.Delete(context.Background(), sb.ID)
//	res, err := sb.Exec(ctx, "uname -a")
//	fmt.Printf("%s", res.Stdout)
//
// Every failed request returns a *Error carrying the API's code, message and
// request id. It unwraps to one of the sentinels below, which are the very
// values the daemon uses (internal/errdefs), so callers test classes with
// errors.Is:
//
//	if errors.Is(err, hutch.ErrNotFound) { ... }
//
// A daemon that cannot be reached at all gives an error matching
// ErrUnavailable.
//
// Hosts are written unix:///path/to/hutch.sock (trusted, no key needed) or
// http(s)://host:port (an API key per request: hutch keys create).
package hutch
