package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	hutch "github.com/hutch-dev/hutch/sdk"
)

// parseKV reads repeated KEY=VALUE flags.
func parseKV(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, invalid("--%s %q: want KEY=VALUE", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

type createFlags struct {
	id, base, cwd, hostname string
	template                string
	env, labels, meta       []string
	memory, cpu, pids       int64
	timeout                 time.Duration
	life                    lifecycleCreateFlags
	net                     networkFlags
}

func (f *createFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.base, "base", "", "root filesystem: host (default), dir:/path or oci:/path/image.tar[#ref]")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.StringVar(&f.cwd, "cwd", "", "working directory (default /workspace)")
	fl.Int64Var(&f.memory, "memory", 0, "memory limit in MiB")
	fl.Int64Var(&f.cpu, "cpu", 0, "CPU limit in millicores (1000 = one core)")
	fl.Int64Var(&f.pids, "pids", 0, "process limit")
}

func (f *createFlags) options() (hutch.CreateOptions, error) {
	o := hutch.CreateOptions{ID: f.id, Base: f.base, Template: f.template, Cwd: f.cwd, Hostname: f.hostname, Timeout: f.timeout,
		Limits: hutch.Limits{MemoryMiB: f.memory, CPUMillis: f.cpu, Pids: f.pids}}
	f.life.apply(&o)
	var err error
	if o.Env, err = parseKV("env", f.env); err != nil {
		return o, err
	}
	if o.Labels, err = parseKV("label", f.labels); err != nil {
		return o, err
	}
	if f.net.given() {
		p, err := f.net.policy()
		if err != nil {
			return o, err
		}
		o.Network = &p
	}
	o.Metadata, err = parseKV("meta", f.meta)
	return o, err
}

func createCmd(g *globals) *cobra.Command {
	var f createFlags
	c := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create and start a sandbox; print its id",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.options()
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.Create(cmd.Context(), o)
			if err != nil {
				return err
			}
			return g.print(sb, func(w io.Writer) { fmt.Fprintln(w, sb.ID) })
		},
	}
	f.register(c)
	fl := c.Flags()
	fl.StringVar(&f.id, "id", "", "the sandbox's id (default: chosen by the daemon)")
	fl.StringVar(&f.hostname, "hostname", "", "the sandbox's hostname")
	fl.StringVar(&f.template, "template", "", "start from this template (see hutch template); a ready one of its warm pool when it has one")
	fl.StringArrayVar(&f.labels, "label", nil, "label key=value, for filtering (repeatable)")
	fl.StringArrayVar(&f.meta, "meta", nil, "metadata key=value (repeatable)")
	fl.DurationVar(&f.timeout, "timeout", 0, "running time until --on-timeout, e.g. 30m; paused and suspended time do not count (default: no limit)")
	f.life.register(c)
	f.net.register(c)
	return c
}

func lsCmd(g *globals) *cobra.Command {
	var states, labels []string
	var all bool
	var limit int
	c := &cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list"},
		Short:   "List sandboxes, oldest first",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lbl, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			o := hutch.ListOptions{Labels: lbl, Limit: limit}
			for _, s := range states {
				for _, st := range strings.Split(s, ",") {
					o.States = append(o.States, hutch.State(strings.TrimSpace(st)))
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sbs, next, err := list(cmd, c, o, all)
			if err != nil {
				return err
			}
			if next != "" && !g.json() {
				defer fmt.Fprintln(g.errOut, "(more sandboxes: use --all)")
			}
			return g.print(sbs, func(w io.Writer) { sandboxTable(w, sbs) })
		},
	}
	fl := c.Flags()
	fl.StringArrayVar(&states, "state", nil, "only these states, e.g. running or running,failed (repeatable)")
	fl.StringArrayVar(&labels, "label", nil, "only sandboxes with label key=value (repeatable; all must match)")
	fl.BoolVar(&all, "all", false, "fetch every page, not just the first")
	fl.IntVar(&limit, "limit", 0, "sandboxes per page (default 100)")
	return c
}

func list(cmd *cobra.Command, c *hutch.Client, o hutch.ListOptions, all bool) ([]hutch.Sandbox, string, error) {
	if !all {
		return c.List(cmd.Context(), o)
	}
	sbs := []hutch.Sandbox{}
	for sb, err := range c.All(cmd.Context(), o) {
		if err != nil {
			return nil, "", err
		}
		sbs = append(sbs, sb)
	}
	return sbs, "", nil
}

func sandboxTable(w io.Writer, sbs []hutch.Sandbox) {
	fmt.Fprintln(w, "ID\tSTATE\tBASE\tCREATED\tLABELS")
	for _, sb := range sbs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.State, sb.Base, ago(sb.CreatedAt), kvs(sb.Labels))
	}
}

// ago is a rough age: 5s ago, 3m ago, 2h ago, 4d ago.
func ago(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

// kvs renders a map as sorted k=v pairs.
func kvs(m map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return strings.Join(out, ",")
}

func inspectCmd(g *globals) *cobra.Command {
	return showCmd(g, "inspect ID", "Show a sandbox", (*hutch.Client).Get, inspectTable)
}

// showCmd is a command that fetches one thing by its argument and prints
// it as a key: value table, or as JSON with -o json.
func showCmd[T any](g *globals, use, short string, get func(*hutch.Client, context.Context, string) (T, error),
	table func(io.Writer, T)) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := get(c, cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.print(v, func(w io.Writer) { table(w, v) })
		},
	}
}

// rowWriter prints "key:<tab>value" lines, skipping empty values.
func rowWriter(w io.Writer) func(k, v string) {
	return func(k, v string) {
		if v != "" {
			fmt.Fprintf(w, "%s:\t%s\n", k, v)
		}
	}
}

func inspectTable(w io.Writer, sb *hutch.Sandbox) {
	row := rowWriter(w)
	row("ID", sb.ID)
	row("State", string(sb.State))
	row("Reason", sb.Reason)
	row("Base", sb.Base)
	row("Template", sb.Template)
	row("Generation", sb.Generation)
	row("Forked from", sb.ForkedFrom)
	row("Hostname", sb.Hostname)
	row("Cwd", sb.Cwd)
	row("Env", kvs(sb.Env))
	row("Labels", kvs(sb.Labels))
	row("Metadata", kvs(sb.Metadata))
	l := sb.Limits
	row("Limits", fmt.Sprintf("memory=%dMiB cpu=%dm pids=%d", l.MemoryMiB, l.CPUMillis, l.Pids))
	if sb.TimeoutSeconds > 0 {
		row("Timeout", (time.Duration(sb.TimeoutSeconds) * time.Second).String())
	}
	lifecycleRows(row, sb)
	row("Network", string(sb.NetworkMode))
	row("Created", sb.CreatedAt.Local().Format(time.RFC3339))
	row("Updated", sb.UpdatedAt.Local().Format(time.RFC3339))
}

func rmCmd(g *globals) *cobra.Command {
	var force bool
	c := &cobra.Command{
		Use:     "rm [-f] ID...",
		Aliases: []string{"delete"},
		Short:   "Destroy sandboxes (stopping at the first failure)",
		Args:    minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			removed := []string{}
			for _, id := range args {
				if err = c.Delete(cmd.Context(), id); force && errors.Is(err, hutch.ErrNotFound) {
					err = nil
				}
				if err != nil {
					err = fmt.Errorf("%s: %w", id, err)
					break
				}
				removed = append(removed, id)
			}
			if perr := printIDs(g, removed); err == nil {
				err = perr
			}
			return err
		},
	}
	c.Flags().BoolVarP(&force, "force", "f", false, "a missing sandbox is no error")
	return c
}

func printIDs(g *globals, ids []string) error {
	return g.print(ids, func(w io.Writer) {
		for _, id := range ids {
			fmt.Fprintln(w, id)
		}
	})
}
