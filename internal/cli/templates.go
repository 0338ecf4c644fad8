package cli

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hutch-dev/hutch/api"
	hutch "github.com/hutch-dev/hutch/sdk"
)

// templateCmds are the verbs of templates, warm pools, snapshot and fork.
func templateCmds(g *globals) []*cobra.Command {
	return []*cobra.Command{templateCmd(g), snapshotCmd(g), forkCmd(g)}
}

func templateCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:     "template",
		Aliases: []string{"templates"},
		Short:   "Define, build, list and remove templates, and size their warm pools",
		Long: "A template is a named recipe — a base, files to seed, host directories to copy in (local socket " +
			"only), environment and setup commands — built once into a read-only layer that every sandbox made " +
			"from it (hutch create --template NAME) stacks, so those start as fast as any other. A changed " +
			"recipe builds a new generation; sandboxes keep theirs. Templates belong to the tenant of the API " +
			"key; the local socket has templates of its own and lists every tenant's.",
		Args: noArgs,
	}
	c.AddCommand(templateBuildCmd(g), templateLsCmd(g), templateInspectCmd(g), templateRmCmd(g), templatePoolCmd(g))
	return c
}

// templateFlags define a template on the command line.
type templateFlags struct {
	file, base, cwd            string
	setup, copies, mounts, env []string
	memory, cpu, pids          int64
}

func (f *templateFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVarP(&f.file, "file", "f", "", "a JSON definition (base, setup, files, mounts, env, cwd, limits, as in the API); flags add to it")
	fl.StringVar(&f.base, "base", "", "root filesystem: host (default), dir:/path or oci:/path/image.tar[#ref]")
	fl.StringArrayVar(&f.setup, "setup", nil, "a setup command, run with sh -c (repeatable, in order)")
	fl.StringArrayVar(&f.copies, "copy", nil, "LOCAL:PATH copies a local file into the template at PATH (relative: under /workspace; repeatable)")
	fl.StringArrayVar(&f.mounts, "mount", nil, "HOSTDIR:PATH copies a host directory tree in at build time (local socket only; repeatable)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE for setup and every sandbox (repeatable)")
	fl.StringVar(&f.cwd, "cwd", "", "working directory of its sandboxes (default /workspace)")
	fl.Int64Var(&f.memory, "memory", 0, "memory limit in MiB")
	fl.Int64Var(&f.cpu, "cpu", 0, "CPU limit in millicores (1000 = one core)")
	fl.Int64Var(&f.pids, "pids", 0, "process limit")
}

// defined reports whether the flags define a template (else build only
// builds the one the daemon has).
func (f *templateFlags) defined(c *cobra.Command) bool {
	for _, n := range []string{"file", "base", "setup", "copy", "mount", "env", "cwd", "memory", "cpu", "pids"} {
		if c.Flags().Changed(n) {
			return true
		}
	}
	return false
}

func (f *templateFlags) definition() (hutch.TemplateDefinition, error) {
	var d hutch.TemplateDefinition
	if f.file != "" {
		var err error
		if d, err = readDefinition(f.file); err != nil {
			return d, err
		}
	}
	if f.base != "" {
		d.Base = f.base
	}
	if f.cwd != "" {
		d.Cwd = f.cwd
	}
	d.Setup = append(d.Setup, f.setup...)
	env, err := parseKV("env", f.env)
	if err != nil {
		return d, err
	}
	if len(env) > 0 && d.Env == nil {
		d.Env = map[string]string{}
	}
	for k, v := range env {
		d.Env[k] = v
	}
	for _, cp := range f.copies {
		local, dst, ok := strings.Cut(cp, ":")
		if !ok || local == "" || dst == "" {
			return d, invalid("--copy %q: want LOCAL:PATH", cp)
		}
		fi, err := os.Stat(local)
		if err != nil || !fi.Mode().IsRegular() {
			return d, invalid("--copy %q: %s is not a readable file", cp, local)
		}
		data, err := os.ReadFile(local)
		if err != nil {
			return d, invalid("--copy %q: %v", cp, err)
		}
		d.Files = append(d.Files, hutch.TemplateFile{Path: dst, Content: data, Mode: fi.Mode().Perm()})
	}
	for _, mt := range f.mounts {
		src, dst, ok := strings.Cut(mt, ":")
		if !ok || src == "" || dst == "" {
			return d, invalid("--mount %q: want HOSTDIR:PATH", mt)
		}
		d.Mounts = append(d.Mounts, hutch.TemplateMount{Path: dst, Source: src})
	}
	if f.memory != 0 {
		d.Limits.MemoryMiB = f.memory
	}
	if f.cpu != 0 {
		d.Limits.CPUMillis = f.cpu
	}
	if f.pids != 0 {
		d.Limits.Pids = f.pids
	}
	return d, nil
}

// readDefinition reads a definition in the API's JSON form (file
// contents as text, or base64 with "encoding": "base64").
func readDefinition(file string) (hutch.TemplateDefinition, error) {
	var d hutch.TemplateDefinition
	raw, err := os.ReadFile(file)
	if err != nil {
		return d, invalid("-f %s: %v", file, err)
	}
	var a api.TemplateDefinition
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return d, invalid("-f %s: %v", file, err)
	}
	d = hutch.TemplateDefinition{Base: a.Base, Setup: a.Setup, Env: a.Env, Cwd: a.Cwd,
		Limits: hutch.Limits{MemoryMiB: a.Limits.MemoryMb, CPUMillis: a.Limits.CpuMillis, Pids: a.Limits.Pids}}
	for _, f := range a.Files {
		content := []byte(f.Content)
		if f.Encoding == api.TemplateFileEncodingBase64 {
			if content, err = base64.StdEncoding.DecodeString(f.Content); err != nil {
				return d, invalid("-f %s: file %s: %v", file, f.Path, err)
			}
		}
		tf := hutch.TemplateFile{Path: f.Path, Content: content}
		if f.Mode != "" {
			n, err := strconv.ParseUint(f.Mode, 8, 32)
			if err != nil || n > 0o777 {
				return d, invalid("-f %s: file %s: mode %q: want octal permission bits", file, f.Path, f.Mode)
			}
			tf.Mode = os.FileMode(n)
		}
		d.Files = append(d.Files, tf)
	}
	for _, m := range a.Mounts {
		d.Mounts = append(d.Mounts, hutch.TemplateMount{Path: m.Path, Source: m.Source})
	}
	return d, nil
}

func templateBuildCmd(g *globals) *cobra.Command {
	var f templateFlags
	var quiet bool
	c := &cobra.Command{
		Use:   "build NAME [flags]",
		Short: "Define (with flags or -f) and build a template, showing the setup output as it runs",
		Long: "build builds the template NAME's current generation, unless it is built already, streaming each " +
			"setup step and its output to stderr, and prints the generation. Definition flags (or -f) create " +
			"or replace the template first; without them the template the daemon has is built. A failed " +
			"setup command fails the build with its log; the next build tries again.",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if f.defined(cmd) {
				d, err := f.definition()
				if err != nil {
					return err
				}
				if _, err := c.PutTemplate(cmd.Context(), args[0], d); err != nil {
					return err
				}
			}
			start := time.Now()
			var watch func(hutch.BuildEvent)
			if !quiet {
				watch = func(ev hutch.BuildEvent) { buildProgress(g.errOut, ev) }
			}
			t, err := c.BuildTemplate(cmd.Context(), args[0], watch)
			if err != nil {
				return err
			}
			if !quiet && !g.json() {
				fmt.Fprintf(g.errOut, "==> %s: generation %s ready (%s)\n", t.Name, t.Generation, time.Since(start).Round(time.Millisecond))
			}
			return g.print(t, func(w io.Writer) { fmt.Fprintln(w, t.Generation) })
		},
	}
	f.register(c)
	c.Flags().BoolVarP(&quiet, "quiet", "q", false, "do not show the build's progress")
	return c
}

// buildProgress shows one build event: steps as ==> lines, output as is.
func buildProgress(w io.Writer, ev hutch.BuildEvent) {
	switch ev.Type {
	case "step":
		if ev.Step == 0 {
			fmt.Fprintf(w, "==> %s\n", ev.Cmd)
		} else {
			fmt.Fprintf(w, "==> step %d: %s\n", ev.Step, ev.Cmd)
		}
	case "output":
		_, _ = w.Write(ev.Data)
	}
}

func templateLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List templates (on the local socket, every tenant's)",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ts, err := c.ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			return g.print(ts, func(w io.Writer) { templateTable(w, ts) })
		},
	}
}

func templateTable(w io.Writer, ts []hutch.Template) {
	tenants := false
	for _, t := range ts {
		tenants = tenants || t.Tenant != ""
	}
	if tenants {
		fmt.Fprint(w, "TENANT\t")
	}
	fmt.Fprintln(w, "NAME\tKIND\tSTATUS\tGENERATION\tPOOL\tUPDATED")
	for _, t := range ts {
		if tenants {
			fmt.Fprintf(w, "%s\t", orDash(t.Tenant))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d/%d\t%s\n", t.Name, t.Kind, t.Status, orDash(t.Generation),
			t.PoolReady, t.PoolSize, ago(t.UpdatedAt))
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func templateInspectCmd(g *globals) *cobra.Command {
	return showCmd(g, "inspect NAME", "Show a template: its recipe, generation, last build and pool",
		(*hutch.Client).GetTemplate, templateInspectTable)
}

func templateInspectTable(w io.Writer, t *hutch.Template) {
	row := rowWriter(w)
	row("Name", t.Name)
	row("Tenant", t.Tenant)
	row("Kind", t.Kind)
	row("Snapshot of", t.SnapshotOf)
	row("Base", t.Base)
	for i, s := range t.Setup {
		row(fmt.Sprintf("Setup %d", i+1), s)
	}
	for _, f := range t.Files {
		row("File", fmt.Sprintf("%s (%d bytes, %04o)", f.Path, f.Size, f.Mode.Perm()))
	}
	for _, m := range t.Mounts {
		row("Mount", m.Source+" -> "+m.Path)
	}
	row("Env", kvs(t.Env))
	row("Cwd", t.Cwd)
	row("Status", t.Status)
	row("Generation", t.Generation)
	if b := t.LastBuild; b != nil {
		row("Last build", b.State+" "+ago(b.At))
		row("Build error", b.Error)
	}
	row("Pool", fmt.Sprintf("%d ready of %d", t.PoolReady, t.PoolSize))
	row("Updated", t.UpdatedAt.Local().Format(time.RFC3339))
}

func templateRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Remove templates (their pools go; sandboxes made from them keep running)",
		Args:    minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			removed := []string{}
			for _, name := range args {
				if err = c.DeleteTemplate(cmd.Context(), name); err != nil {
					err = fmt.Errorf("%s: %w", name, err)
					break
				}
				removed = append(removed, name)
			}
			if perr := printIDs(g, removed); err == nil {
				err = perr
			}
			return err
		},
	}
}

func templatePoolCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "pool NAME SIZE",
		Short: "Keep SIZE sandboxes of a template made ahead (0 empties the pool)",
		Long: "A warm pool keeps SIZE sandboxes of the template created and running, owned by no tenant; " +
			"hutch create --template NAME takes one at once (when it asks for no other env, cwd, limits, " +
			"hostname or id) and the pool refills in the background. Pools survive daemon restarts.",
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			size, err := strconv.Atoi(args[1])
			if err != nil {
				return invalid("pool size %q: want a number", args[1])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.SetTemplatePool(cmd.Context(), args[0], size)
			if err != nil {
				return err
			}
			return g.print(t, func(w io.Writer) { fmt.Fprintf(w, "%s: pool of %d (%d ready)\n", t.Name, t.PoolSize, t.PoolReady) })
		},
	}
}

func snapshotCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "snapshot ID TEMPLATE",
		Short: "Freeze a sandbox's filesystem into a new generation of a template (made if missing)",
		Long: "snapshot freezes the sandbox's files (its processes pause for the copy, then run on) into a new " +
			"generation of TEMPLATE; hutch create --template TEMPLATE then starts from them. It prints the " +
			"generation.",
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			t, err := sb.Snapshot(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			return g.print(t, func(w io.Writer) { fmt.Fprintln(w, t.Generation) })
		},
	}
}

func forkCmd(g *globals) *cobra.Command {
	var count int
	var labels, meta []string
	c := &cobra.Command{
		Use:   "fork ID [flags]",
		Short: "Start new sandboxes from a sandbox's files as they are now (no processes); print their ids",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o := hutch.ForkOptions{Count: count}
			var err error
			if o.Labels, err = parseKV("label", labels); err != nil {
				return err
			}
			if o.Metadata, err = parseKV("meta", meta); err != nil {
				return err
			}
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			forks, err := sb.Fork(cmd.Context(), o)
			if err != nil {
				return err
			}
			return g.print(forks, func(w io.Writer) {
				for _, f := range forks {
					fmt.Fprintln(w, f.ID)
				}
			})
		},
	}
	fl := c.Flags()
	fl.IntVarP(&count, "count", "n", 1, "how many sandboxes (at most 16)")
	fl.StringArrayVar(&labels, "label", nil, "label key=value of the new sandboxes (repeatable)")
	fl.StringArrayVar(&meta, "meta", nil, "metadata key=value of the new sandboxes (repeatable)")
	return c
}
