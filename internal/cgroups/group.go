package cgroups

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// How long Freeze waits for every task to stop, Kill for the group to
// empty, and Delete for both plus the rmdirs.
const (
	freezeTimeout = 2 * time.Second
	killTimeout   = 2 * time.Second
	deleteTimeout = 2 * time.Second
)

// Group is one sandbox's cgroup: a directory per hierarchy on v1, one
// directory on v2. It holds no state beyond its paths, so a Group from Load
// is as good as the one from Create, and methods may be called concurrently.
type Group struct {
	m    *Manager
	id   string
	dirs []ctrlDir
}

// ID returns the id the group was made with.
func (g *Group) ID() string { return g.id }

// Path returns the absolute path of the group's directory for controller
// (e.g. "memory"), or "" when the group has none there. On v2 every
// controller shares the one directory, which is returned for any name.
func (g *Group) Path(controller string) string {
	if g.m.mode == V2 {
		return g.dirs[0].path
	}
	return g.dir(controller)
}

func (g *Group) dir(controller string) string {
	for _, d := range g.dirs {
		if d.name == controller {
			return d.path
		}
	}
	return ""
}

// mkdirs makes the group's directory in every hierarchy. made lists the
// ones this call created, for rollback; fresh is true when it created all
// of them, so kernel defaults (no limits, thawed) can be relied on.
func (g *Group) mkdirs() (made []string, fresh bool, err error) {
	fresh = true
	for _, d := range g.dirs {
		created, err := mkdir(d.path)
		if err != nil {
			return made, false, wrap(err, "cgroups: create %s", d.path)
		}
		if created {
			made = append(made, d.path)
			continue
		}
		fresh = false
		pids, err := readPids(d.path)
		if err != nil {
			return made, false, wrap(err, "cgroups: reuse %s", d.path)
		}
		if len(pids) > 0 {
			return made, false, fmt.Errorf("cgroups: %s: %w: %w", d.path, errNotEmpty, errdefs.ErrAlreadyExists)
		}
	}
	return made, fresh, nil
}

// rmdirs removes dirs, last first, ignoring errors: it only undoes a
// failed Create, whose error is the one worth reporting.
func (g *Group) rmdirs(dirs []string) {
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = unix.Rmdir(dirs[i])
	}
}

// AddProc moves process pid, with all its threads, into the group in every
// hierarchy.
func (g *Group) AddProc(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("cgroups: pid %d: %w", pid, errdefs.ErrInvalidArgument)
	}
	for _, d := range g.dirs {
		if err := writeProcs(d.path, pid); err != nil {
			return wrap(err, "cgroups: add pid %d to %s", pid, d.path)
		}
	}
	return nil
}

// Update replaces the group's limits.
func (g *Group) Update(l Limits) error {
	if err := checkLimits(l); err != nil {
		return err
	}
	return g.m.drv.setLimits(g, l, false)
}

// Freeze stops every task in the group and returns once all are stopped.
func (g *Group) Freeze() error {
	return g.m.drv.freeze(g, time.Now().Add(freezeTimeout))
}

// Thaw lets a frozen group run again.
func (g *Group) Thaw() error { return g.m.drv.thaw(g) }

// Pids lists the processes in the group, sorted.
func (g *Group) Pids() ([]int, error) {
	pids, err := g.allPids()
	if err != nil {
		return nil, err
	}
	slices.Sort(pids)
	return slices.Compact(pids), nil
}

// allPids is the union of cgroup.procs over the group's directories; a
// directory already gone counts as empty.
func (g *Group) allPids() ([]int, error) {
	var all []int
	for _, d := range g.dirs {
		pids, err := readPids(d.path)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return nil, wrap(err, "cgroups: list %s", d.path)
		}
		all = append(all, pids...)
	}
	return all, nil
}

// Kill sends SIGKILL to every process in the group, including ones forked
// while it runs, and returns once the group is empty.
func (g *Group) Kill() error { return g.kill(time.Now().Add(killTimeout)) }

func (g *Group) kill(deadline time.Time) error {
	pids, err := g.allPids()
	if err != nil || len(pids) == 0 {
		return err
	}
	if err := g.m.drv.killAll(g, deadline); err != nil {
		return err
	}
	return g.killUntilEmpty(deadline)
}

// signalAll sends SIGKILL to every process listed now.
func (g *Group) signalAll() {
	pids, _ := g.allPids()
	for _, pid := range pids {
		_ = unix.Kill(pid, unix.SIGKILL) // ESRCH: already gone
	}
}

// killUntilEmpty kills whatever is listed until nothing is. After the
// driver's race-free pass it normally finds the group empty at once; it is
// also the whole kill where no freezer or cgroup.kill exists.
func (g *Group) killUntilEmpty(deadline time.Time) error {
	err := poll(deadline, func() (bool, error) {
		pids, err := g.allPids()
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL) // ESRCH: already gone
		}
		return len(pids) == 0, err
	})
	if err != nil {
		return fmt.Errorf("cgroups: kill %s: %w", g.id, err)
	}
	return nil
}

// Delete kills what is left in the group, waits for it to empty and
// removes its directories. A group already (partly) gone is not an error.
func (g *Group) Delete() error {
	// Fast path, the usual case: the sandbox is gone and the group empty,
	// so rmdir works at once and cgroup.procs need not be read anywhere.
	busy := false
	for _, d := range g.dirs {
		if err := unix.Rmdir(d.path); err != nil && !errors.Is(err, unix.ENOENT) {
			busy = true
		}
	}
	if !busy {
		return nil
	}
	deadline := time.Now().Add(deleteTimeout)
	if err := g.kill(deadline); err != nil {
		return err
	}
	for _, d := range g.dirs {
		if err := rmdirWait(d.path, deadline); err != nil {
			return wrap(err, "cgroups: delete %s", d.path)
		}
	}
	return nil
}

// rmdirWait removes a cgroup directory, killing and retrying while it is
// busy (a process added by a racing AddProc, or one still exiting).
func rmdirWait(dir string, deadline time.Time) error {
	return poll(deadline, func() (bool, error) {
		err := unix.Rmdir(dir)
		switch {
		case err == nil, errors.Is(err, unix.ENOENT):
			return true, nil
		case !errors.Is(err, unix.EBUSY):
			return false, err
		}
		pids, _ := readPids(dir)
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		return false, nil
	})
}

// Stats reads the group's usage and limits.
func (g *Group) Stats() (Stats, error) { return g.m.drv.stats(g) }
