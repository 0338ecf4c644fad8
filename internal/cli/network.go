package cli

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	hutch "github.com/hutch-dev/hutch/sdk"
)

// networkFlags are the policy flags of create and network set.
type networkFlags struct {
	mode               string
	allow, deny, creds []string
}

func (f *networkFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.mode, "network", "", "network mode: deny-all (loopback only; the default), allow-all, or allow-list "+
		"(default allow-list when --allow is given)")
	fl.StringArrayVar(&f.allow, "allow", nil, "allow HOST[:PORT,...] (a name or *.domain; default ports 80,443) or "+
		"IP/CIDR[:PORT,...] (default every port) (repeatable)")
	fl.StringArrayVar(&f.deny, "deny", nil, "refuse this IP or CIDR whatever else allows (repeatable)")
	fl.StringArrayVar(&f.creds, "credential", nil, "HOST:Header=value: add or replace this header on HTTP(S) requests "+
		"to HOST on their way out (repeatable). The daemon keeps the value: the sandbox never sees it and hutch "+
		"never shows it again (it prints [redacted])")
}

// given reports whether any policy flag was set.
func (f *networkFlags) given() bool {
	return f.mode != "" || len(f.allow)+len(f.deny)+len(f.creds) > 0
}

// policy builds the policy the flags describe.
func (f *networkFlags) policy() (hutch.NetworkPolicy, error) {
	p := hutch.NetworkPolicy{Mode: hutch.NetworkMode(f.mode)}
	switch p.Mode {
	case hutch.NetworkDenyAll, hutch.NetworkAllowAll, hutch.NetworkAllowList:
	case "":
		p.Mode = hutch.NetworkDenyAll
		if len(f.allow) > 0 {
			p.Mode = hutch.NetworkAllowList
		}
	default:
		return p, invalid("--network %q: want deny-all, allow-all or allow-list", f.mode)
	}
	for _, a := range f.allow {
		r, err := parseAllow(a)
		if err != nil {
			return p, err
		}
		p.Allow = append(p.Allow, r)
	}
	for _, d := range f.deny {
		if _, err := parseCIDR(d); err != nil {
			return p, invalid("--deny %q: want an IP or CIDR", d)
		}
		p.Deny = append(p.Deny, d)
	}
	creds, err := parseCredentials(f.creds)
	p.Credentials = creds
	return p, err
}

// parseAllow reads an --allow value (hutch.ParseNetworkRule's short form).
func parseAllow(s string) (hutch.NetworkRule, error) {
	r, err := hutch.ParseNetworkRule(s)
	var re *hutch.RuleError
	if errors.As(err, &re) {
		return r, invalid("--allow %q: %s", re.Rule, re.Problem)
	}
	return r, err
}

func parseCIDR(s string) (netip.Prefix, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	return netip.ParsePrefix(s)
}

// parseCredentials reads HOST:Header=value flags; headers for one host
// make one credential.
func parseCredentials(flags []string) ([]hutch.NetworkCredential, error) {
	var out []hutch.NetworkCredential
	byHost := map[string]int{}
	for _, s := range flags {
		host, hv, ok := strings.Cut(s, ":")
		name, value, ok2 := strings.Cut(hv, "=")
		name = strings.TrimSpace(name)
		if !ok || !ok2 || strings.TrimSpace(host) == "" || name == "" {
			// The value is a secret: never echo it back in the error.
			return nil, invalid("--credential %q: want HOST:Header=value", redactCredential(s))
		}
		i, seen := byHost[host]
		if !seen {
			i = len(out)
			byHost[host] = i
			out = append(out, hutch.NetworkCredential{Host: host, Headers: map[string]string{}})
		}
		out[i].Headers[name] = value
	}
	return out, nil
}

// redactCredential keeps what a credential flag says before its value:
// up to its '=', or without one, up to its first ':'; nothing without
// either.
func redactCredential(s string) string {
	if i := strings.IndexByte(s, '='); i >= 0 {
		return s[:i+1] + "…"
	}
	if i := strings.IndexByte(s, ':'); i >= 0 {
		return s[:i+1] + "…"
	}
	return "…"
}

func networkCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "network",
		Short: "Show and change a sandbox's network policy, and its egress decisions",
		Long: "Every sandbox has a network policy: deny-all (loopback only; the default), allow-all (TCP and " +
			"DNS out, except private, link-local, loopback, the host's and other sandboxes' addresses unless an " +
			"--allow CIDR names them) or allow-list (exactly the --allow rules). --deny always wins. A daemon " +
			"running without networking refuses any mode but deny-all (failed_precondition).",
		Args: noArgs,
	}
	c.AddCommand(networkShowCmd(g), networkSetCmd(g), networkEventsCmd(g))
	return c
}

func networkShowCmd(g *globals) *cobra.Command {
	return showCmd(g, "show ID", "Show a sandbox's network policy (credential values redacted)",
		(*hutch.Client).Network, policyTable)
}

func networkSetCmd(g *globals) *cobra.Command {
	var f networkFlags
	c := &cobra.Command{
		Use:   "set ID [flags]",
		Short: "Replace a sandbox's network policy, live; print the policy now in force",
		Long: "set replaces the whole policy with the one the flags describe (flags not given are empty, not " +
			"kept): new connections follow it at once; a suspended sandbox gets it when it resumes.",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !f.given() {
				return invalid("hutch network set: nothing to set; give --network, --allow, --deny or --credential")
			}
			p, err := f.policy()
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.SetNetwork(cmd.Context(), args[0], p)
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) { policyTable(w, out) })
		},
	}
	f.register(c)
	return c
}

// policyTable prints a policy in the flags' own syntax.
func policyTable(w io.Writer, p *hutch.NetworkPolicy) {
	row := rowWriter(w)
	row("Mode", string(p.Mode))
	for _, r := range p.Allow {
		row("Allow", ruleString(r))
	}
	for _, d := range p.Deny {
		row("Deny", d)
	}
	for _, c := range p.Credentials {
		for _, k := range slices.Sorted(maps.Keys(c.Headers)) {
			row("Credential", c.Host+":"+k+"="+c.Headers[k])
		}
	}
}

func ruleString(r hutch.NetworkRule) string {
	s := r.Host
	if r.CIDR != "" {
		s = r.CIDR
		if strings.Contains(s, ":") && len(r.Ports) > 0 {
			s = "[" + s + "]"
		}
	}
	var ports []string
	for _, p := range r.Ports {
		ports = append(ports, strconv.Itoa(p))
	}
	if len(ports) > 0 {
		s += ":" + strings.Join(ports, ",")
	}
	return s
}

func networkEventsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "events ID",
		Short: "List a sandbox's most recent egress decisions (up to 256), oldest first",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			evs, err := c.NetworkEvents(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.print(evs, func(w io.Writer) { eventTable(w, evs) })
		},
	}
}

func eventTable(w io.Writer, evs []hutch.NetworkEvent) {
	fmt.Fprintln(w, "TIME\tPROTO\tHOST\tIP\tPORT\tVERDICT\tUP\tDOWN\tREASON")
	for _, e := range evs {
		verdict := "denied"
		if e.Allowed {
			verdict = "allowed"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", e.Time.Local().Format(time.TimeOnly), e.Proto,
			dash(e.Host), dash(e.IP), e.Port, verdict, bytesText(e.BytesUp), bytesText(e.BytesDown), e.Reason)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func portCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:     "port",
		Aliases: []string{"ports"},
		Short:   "Expose sandbox ports through the daemon (HTTP and WebSocket)",
		Long: "An exposed port is served by the daemon at /v1/sandboxes/ID/ports/PORT/ on its listeners and, " +
			"when it runs with --domain, at http://PORT-ID.DOMAIN/. A request needs an API key of the " +
			"sandbox's tenant, the local socket, or the port's token (header X-Hutch-Port-Token or query " +
			"parameter hutch_port_token), unless the port is public. The server in the sandbox may listen " +
			"on 127.0.0.1.",
		Args: noArgs,
	}
	c.AddCommand(portExposeCmd(g), portLsCmd(g), portRmCmd(g))
	return c
}

// portArg reads a PORT argument.
func portArg(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, invalid("port %q: want a number 1-65535", s)
	}
	return n, nil
}

func portExposeCmd(g *globals) *cobra.Command {
	var public bool
	c := &cobra.Command{
		Use:   "expose ID PORT [--public]",
		Short: "Expose a port of a sandbox; print its path, URLs and token",
		Long: "expose makes a sandbox port reachable through the daemon and prints where (its path on the " +
			"daemon, the full URL through --host when that is http(s), and the per-host URL when the daemon " +
			"has a domain) and the token that opens it. Exposing a port again replaces its token.",
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := portArg(args[1])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ep, err := c.ExposePort(cmd.Context(), args[0], port, public)
			if err != nil {
				return err
			}
			return g.print(ep, func(w io.Writer) {
				row := rowWriter(w)
				row("Port", strconv.Itoa(ep.Port))
				row("Public", strconv.FormatBool(ep.Public))
				row("Path", ep.Path)
				row("API URL", apiURL(c, *ep))
				row("URL", ep.URL)
				row("Token", ep.Token)
			})
		},
	}
	c.Flags().BoolVar(&public, "public", false, "anyone may use it: no API key or token needed")
	return c
}

// apiURL is the port's URL through the client's host, when that is one a
// browser or curl can use as it is (not a unix socket).
func apiURL(c *hutch.Client, ep hutch.ExposedPort) string {
	if h := c.Host(); strings.HasPrefix(h, "http://") || strings.HasPrefix(h, "https://") {
		return c.PortURL(ep)
	}
	return ""
}

func portLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls ID",
		Aliases: []string{"list"},
		Short:   "List a sandbox's exposed ports, with their tokens",
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ports, err := c.Ports(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.print(ports, func(w io.Writer) {
				fmt.Fprintln(w, "PORT\tPUBLIC\tPATH\tURL\tTOKEN")
				for _, p := range ports {
					fmt.Fprintf(w, "%d\t%t\t%s\t%s\t%s\n", p.Port, p.Public, p.Path, dash(p.URL), p.Token)
				}
			})
		},
	}
}

func portRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID PORT...",
		Aliases: []string{"unexpose"},
		Short:   "Stop exposing ports of a sandbox (one not exposed is no error)",
		Args:    minArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var ports []int
			for _, a := range args[1:] {
				p, err := portArg(a)
				if err != nil {
					return err
				}
				ports = append(ports, p)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, p := range ports {
				if err := c.UnexposePort(cmd.Context(), args[0], p); err != nil {
					return fmt.Errorf("port %d: %w", p, err)
				}
			}
			return g.print(ports, func(w io.Writer) {
				for _, p := range ports {
					fmt.Fprintln(w, p)
				}
			})
		},
	}
}
