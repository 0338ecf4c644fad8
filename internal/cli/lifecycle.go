package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	hutch "github.com/hutch-dev/hutch/sdk"
)

// lifecycleCmds are the verbs of the sandbox lifecycle.
func lifecycleCmds(g *globals) []*cobra.Command {
	return []*cobra.Command{
		moveCmd(g, "pause", "Freeze sandboxes' processes, keeping their memory",
			(*hutch.Sandbox).Pause),
		moveCmd(g, "suspend", "Archive sandboxes' files and let their processes and memory go",
			(*hutch.Sandbox).Suspend),
		moveCmd(g, "resume", "Bring paused, suspended or retired sandboxes back to running",
			(*hutch.Sandbox).Resume),
		updateCmd(g), archiveCmd(g),
	}
}

// moveCmd is a verb that moves each sandbox it is given, stopping at the
// first failure, and shows where they went.
func moveCmd(g *globals, verb, short string, op func(*hutch.Sandbox, context.Context) (*hutch.Sandbox, error)) *cobra.Command {
	long := short + "."
	if verb == "suspend" {
		long = "suspend keeps a sandbox's whole writable layer (every file changed anywhere in its root " +
			"filesystem, not only /workspace) as an archive and lets its processes and memory go: they are " +
			"not kept. When the archive would be over the daemon's cap, the suspend fails with " +
			"resource_exhausted and the sandbox runs on untouched. `hutch archive` downloads the archive."
	}
	return &cobra.Command{
		Use:   verb + " ID...",
		Short: short,
		Long:  long,
		Args:  minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			done := []hutch.Sandbox{}
			for _, id := range args {
				sb, err := op(c.Sandbox(id), cmd.Context())
				if err != nil {
					_ = g.print(done, func(w io.Writer) { lifecycleTable(w, done) })
					return fmt.Errorf("%s: %w", id, err)
				}
				done = append(done, *sb)
			}
			return g.print(done, func(w io.Writer) { lifecycleTable(w, done) })
		},
	}
}

func lifecycleTable(w io.Writer, sbs []hutch.Sandbox) {
	if len(sbs) == 0 {
		return
	}
	fmt.Fprintln(w, "ID\tSTATE\tTIME USED\tARCHIVE")
	for _, sb := range sbs {
		archive := ""
		if a := sb.Archive; a != nil {
			archive = bytesText(a.Size)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", sb.ID, sb.State, usedText(sb.TimeUsed), archive)
	}
}

func usedText(d time.Duration) string { return d.Round(time.Second).String() }

// bytesText is a size for people: 512B, 12.3KiB, 4.0MiB.
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// timerValue is a duration flag that also takes "never" (as the value
// never).
type timerValue struct {
	d     time.Duration
	never time.Duration
}

func (v *timerValue) String() string {
	switch {
	case v.d == 0:
		return ""
	case v.d == v.never:
		return "never"
	}
	return v.d.String()
}

func (v *timerValue) Set(s string) error {
	if strings.EqualFold(s, "never") {
		v.d = v.never
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("%q: want a duration such as 90s, 10m or 2h, or never", s)
	}
	v.d = d
	return nil
}

func (v *timerValue) Type() string { return "duration|never" }

// lifecycleCreateFlags are create's lifecycle flags.
type lifecycleCreateFlags struct {
	onTimeout    string
	idle, retire timerValue
	noAutoResume bool
}

func (f *lifecycleCreateFlags) register(c *cobra.Command) {
	f.idle.never, f.retire.never = -1, -1
	fl := c.Flags()
	fl.StringVar(&f.onTimeout, "on-timeout", "", "what --timeout does: destroy (default) or suspend")
	fl.Var(&f.idle, "idle-timeout", "suspend the sandbox after this long idle, or never (default 5m)")
	fl.Var(&f.retire, "retire-after", "retire the sandbox after this long suspended, keeping only its archive, or never (default 5h)")
	fl.BoolVar(&f.noAutoResume, "no-auto-resume", false, "calls on a paused or suspended sandbox fail instead of resuming it")
}

func (f *lifecycleCreateFlags) apply(o *hutch.CreateOptions) {
	o.OnTimeout, o.IdleTimeout, o.RetireAfter = f.onTimeout, f.idle.d, f.retire.d
	if f.noAutoResume {
		no := false
		o.AutoResume = &no
	}
}

func updateCmd(g *globals) *cobra.Command {
	var onTimeout string
	var autoResume bool
	timeout, idle, retire := timerValue{}, timerValue{never: -1}, timerValue{never: -1}
	c := &cobra.Command{
		Use:   "update ID [flags]",
		Short: "Change a sandbox's timers live",
		Long: "update changes the timers of a sandbox, running or not; flags not given stay as they are. " +
			"--timeout is the running time the sandbox may use in all, counted from its creation (paused and " +
			"suspended time excluded): raising it extends the sandbox, one already past a lowered timeout is " +
			"reaped. 0 stands for the daemon's default with --idle-timeout and --retire-after, and for no " +
			"limit with --timeout.",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var o hutch.UpdateOptions
			fl := cmd.Flags()
			if fl.Changed("timeout") {
				o.Timeout = &timeout.d
			}
			if fl.Changed("on-timeout") {
				o.OnTimeout = &onTimeout
			}
			if fl.Changed("idle-timeout") {
				o.IdleTimeout = &idle.d
			}
			if fl.Changed("retire-after") {
				o.RetireAfter = &retire.d
			}
			if fl.Changed("auto-resume") {
				o.AutoResume = &autoResume
			}
			if o == (hutch.UpdateOptions{}) {
				return invalid("%s: nothing to change; give --timeout, --on-timeout, --idle-timeout, --retire-after or --auto-resume", cmd.CommandPath())
			}
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			if _, err := sb.Update(cmd.Context(), o); err != nil {
				return err
			}
			return g.print(sb, func(w io.Writer) { inspectTable(w, sb) })
		},
	}
	fl := c.Flags()
	fl.Var(&timeout, "timeout", "running time the sandbox may use in all, e.g. 2h; 0 or never = no limit")
	fl.StringVar(&onTimeout, "on-timeout", "", "what the timeout does: destroy or suspend")
	fl.Var(&idle, "idle-timeout", "suspend the sandbox after this long idle, or never")
	fl.Var(&retire, "retire-after", "retire the sandbox after this long suspended, or never")
	fl.BoolVar(&autoResume, "auto-resume", true, "whether calls on a paused or suspended sandbox resume it (--auto-resume=false: they fail)")
	return c
}

// lifecycleRows are inspect's lines about the lifecycle.
func lifecycleRows(row func(k, v string), sb *hutch.Sandbox) {
	row("On timeout", sb.OnTimeout)
	row("Idle timeout", secondsText(sb.IdleTimeoutSeconds))
	row("Retire after", secondsText(sb.RetireAfterSeconds))
	row("Auto resume", fmt.Sprint(sb.AutoResume))
	row("Time used", usedText(sb.TimeUsed))
	if a := sb.Archive; a != nil {
		row("Archive", fmt.Sprintf("%s (%s uncompressed), created %s", bytesText(a.Size), bytesText(a.Bytes),
			a.CreatedAt.Local().Format(time.RFC3339)))
		row("Archive sha256", a.SHA256)
	}
}

// secondsText shows a timer: 5m0s, never; "" when unset.
func secondsText(s int) string {
	switch {
	case s < 0:
		return "never"
	case s == 0:
		return ""
	}
	return (time.Duration(s) * time.Second).String()
}

func archiveCmd(g *globals) *cobra.Command {
	var dest string
	c := &cobra.Command{
		Use:   "archive ID [-o FILE|-]",
		Short: "Download the archive of a suspended sandbox",
		Long: "archive downloads the archive a sandbox's last suspension kept: a zstd-compressed tar of its " +
			"whole writable layer, owners relative to the sandbox. It is written to FILE (default ID.tar.zst), " +
			"or with -o - to standard output, and its sha256 is checked against the daemon's. Here -o names " +
			"the destination; `hutch inspect -o json ID` shows the archive's size and sha256 as JSON.",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			rc, info, err := sb.DownloadSandboxArchive(cmd.Context())
			if err != nil {
				return err
			}
			defer rc.Close()
			if dest == "-" {
				_, err := io.Copy(g.out, rc)
				return err
			}
			if dest == "" {
				dest = args[0] + ".tar.zst"
			}
			if err := writeFile(dest, rc); err != nil {
				return err
			}
			return g.print(info, func(w io.Writer) {
				fmt.Fprintf(w, "File:\t%s\nSize:\t%d\nSHA256:\t%s\n", dest, info.Size, info.SHA256)
			})
		},
	}
	// -o is the destination here, as in curl; it hides the global -o.
	c.Flags().StringVarP(&dest, "output", "o", "", "where to write the archive: a file (default ID.tar.zst) or - for standard output")
	return c
}

// writeFile writes r to path, leaving no partial file behind on failure.
func writeFile(path string, r io.Reader) error {
	f, err := os.Create(path)
	if err != nil {
		return localErr(err)
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = localErr(cerr)
	}
	if err != nil {
		_ = os.Remove(path)
	}
	return err
}
