package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// v2Controllers are the controllers groups get on v2; memory and pids are
// required, cpu is used when available. Freezing and killing are core
// cgroup2 files (cgroup.freeze, cgroup.kill), not controllers.
var v2Controllers = []string{ctrlMemory, ctrlPids, ctrlCPU}

// evacuateLeaf is where New moves the processes of the daemon's own cgroup
// when that cgroup must hand controllers down (see enableControllers).
const evacuateLeaf = "daemon"

type v2 struct {
	cpu bool // the cpu controller is enabled for groups
}

// newV2 sets up groups under the cgroup2 mount mnt, own being the caller's
// cgroup path in it. strict requires memory and pids; tests turn it off to
// exercise the v2 code on a hybrid host's controller-less cgroup2 mount.
func newV2(opts Options, mnt mount, own string, strict bool) (*Manager, error) {
	parent, err := parentDir(opts, mnt, own)
	if err != nil {
		return nil, err
	}
	b, err := readFile(filepath.Join(mnt.point, "cgroup.controllers"))
	if err != nil {
		return nil, wrap(err, "cgroups: read cgroup2 controllers")
	}
	avail := strings.Fields(string(b))
	var want, missing []string
	for _, c := range v2Controllers {
		switch {
		case slices.Contains(avail, c):
			want = append(want, c)
		case c != ctrlCPU && strict:
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return nil, errNoController("cgroup v2", missing)
	}
	ownDir := ""
	if opts.Parent == "" {
		ownDir = filepath.Dir(parent)
	}
	if err := enableControllers(mnt.point, parent, want, ownDir); err != nil {
		return nil, err
	}
	return &Manager{
		mode:    V2,
		parents: []ctrlDir{{"", parent}},
		drv:     &v2{cpu: slices.Contains(want, ctrlCPU)},
	}, nil
}

// enableControllers makes parent and turns want on in cgroup.subtree_control
// of every directory from the mount point down to parent, so that groups made
// in parent get those controllers. cgroup2 lets no cgroup but the root both
// hold processes and hand controllers down; when that is the daemon's own
// cgroup (ownDir), its processes are moved to the leaf ownDir/daemon first,
// which is what systemd asks of a service given Delegate=yes.
func enableControllers(point, parent string, want []string, ownDir string) error {
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return wrap(err, "cgroups: create parent")
	}
	rel, err := filepath.Rel(point, parent)
	if err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	dir := point
	for _, part := range strings.Split(rel, "/") {
		if part != "." {
			dir = filepath.Join(dir, part)
		}
		err := enableIn(dir, want)
		if errors.Is(err, unix.EBUSY) && dir == ownDir {
			if err = evacuate(ownDir); err == nil {
				err = enableIn(dir, want)
			}
		}
		if err != nil {
			return wrap(err, "cgroups: enable %v in %s", want, dir)
		}
	}
	return nil
}

// enableIn writes the controllers of want that dir does not yet hand down.
func enableIn(dir string, want []string) error {
	path := filepath.Join(dir, "cgroup.subtree_control")
	b, err := readFile(path)
	if err != nil {
		return err
	}
	on := strings.Fields(string(b))
	var add []string
	for _, c := range want {
		if !slices.Contains(on, c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	return writeFile(path, strings.Join(add, " "))
}

// evacuate moves every process of dir into dir/daemon, retrying while
// processes fork.
func evacuate(dir string) error {
	leaf := filepath.Join(dir, evacuateLeaf)
	if _, err := mkdir(leaf); err != nil {
		return err
	}
	return poll(time.Now().Add(time.Second), func() (bool, error) {
		pids, err := readPids(dir)
		for _, pid := range pids {
			if err := writeProcs(leaf, pid); err != nil && !errors.Is(err, unix.ESRCH) {
				return false, err
			}
		}
		return len(pids) == 0, err
	})
}

func (d *v2) setLimits(g *Group, l Limits, fresh bool) error {
	dir := g.dirs[0].path
	if err := setMemoryV2(dir, l.MemoryBytes, fresh); err != nil {
		return err
	}
	if err := setPids(dir, l.Pids, fresh); err != nil {
		return err
	}
	if err := d.setCPU(dir, l.CPUMillis, fresh); err != nil {
		return err
	}
	if !fresh {
		return d.thaw(g) // a reused group may have been left frozen
	}
	return nil
}

func setMemoryV2(dir string, limit int64, fresh bool) error {
	if fresh && limit == 0 {
		return nil
	}
	mem, swap := "max", "max"
	if limit > 0 {
		mem, swap = strconv.FormatInt(limit, 10), "0"
	}
	path := filepath.Join(dir, "memory.max")
	if err := writeFile(path, mem); err != nil {
		return wrapLimit(err, path)
	}
	// memory.swap.max is missing when the kernel has no swap accounting.
	path = filepath.Join(dir, "memory.swap.max")
	if err := writeFile(path, swap); err != nil && !errors.Is(err, unix.ENOENT) {
		return wrapLimit(err, path)
	}
	return nil
}

func (d *v2) setCPU(dir string, millis int64, fresh bool) error {
	if !d.cpu {
		if millis > 0 {
			return errNoController("cgroup v2", []string{ctrlCPU})
		}
		return nil
	}
	if fresh && millis == 0 {
		return nil
	}
	val := fmt.Sprintf("max %d", cfsPeriodUs)
	if millis > 0 {
		val = fmt.Sprintf("%d %d", millis*cfsPeriodUs/1000, cfsPeriodUs)
	}
	path := filepath.Join(dir, "cpu.max")
	return wrapLimit(writeFile(path, val), path)
}

// freeze writes cgroup.freeze and waits for cgroup.events to say frozen.
func (d *v2) freeze(g *Group, deadline time.Time) error {
	dir := g.dirs[0].path
	if err := writeFile(filepath.Join(dir, "cgroup.freeze"), "1"); err != nil {
		return wrap(err, "cgroups: freeze %s", g.id)
	}
	err := poll(deadline, func() (bool, error) {
		n, err := readKey(filepath.Join(dir, "cgroup.events"), "frozen")
		return n == 1, err
	})
	if err != nil {
		_ = d.thaw(g) // don't leave it half-frozen
		return wrap(err, "cgroups: freeze %s", g.id)
	}
	return nil
}

func (d *v2) thaw(g *Group) error {
	path := filepath.Join(g.dirs[0].path, "cgroup.freeze")
	return wrap(writeFile(path, "0"), "cgroups: thaw %s", g.id)
}

// killAll uses cgroup.kill (Linux 5.14+), which the kernel makes race-free;
// before that it freezes, kills and thaws like v1.
func (d *v2) killAll(g *Group, deadline time.Time) error {
	err := writeFile(filepath.Join(g.dirs[0].path, "cgroup.kill"), "1")
	if !errors.Is(err, unix.ENOENT) {
		return wrap(err, "cgroups: kill %s", g.id)
	}
	soon := earliest(deadline, time.Now().Add(freezeTimeout/4))
	if err := d.freeze(g, soon); err != nil {
		return nil // Group.killUntilEmpty's loop is the fallback
	}
	g.signalAll()
	return d.thaw(g)
}

func (d *v2) stats(g *Group) (Stats, error) {
	var r statReader
	dir := g.dirs[0].path
	s := Stats{
		MemoryBytes: r.int(dir, "memory.current"),
		MemoryLimit: r.int(dir, "memory.max"),
		OOMKills:    r.key(dir, "memory.events", "oom_kill"),
		Pids:        r.int(dir, "pids.current"),
		PidsLimit:   r.int(dir, "pids.max"),
	}
	// cpu.stat's usage_usec is core cgroup2, there even without the controller.
	s.CPUUsageNanos = uint64(r.key(dir, "cpu.stat", "usage_usec")) * 1000
	return s, r.err
}
