package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// driver is what differs between v1 and v2.
type driver interface {
	// setLimits writes l; fresh says the group was just made, so files
	// still at their kernel defaults (unlimited, thawed) can be skipped.
	setLimits(g *Group, l Limits, fresh bool) error
	freeze(g *Group, deadline time.Time) error
	thaw(g *Group) error
	// killAll is one race-free SIGKILL pass: no process can fork a new one
	// that it misses. Waiting for the group to empty is the caller's.
	killAll(g *Group, deadline time.Time) error
	stats(g *Group) (Stats, error)
}

// v1Controllers are the hierarchies groups are made in on v1, in order.
// memory and pids are required; cpu and freezer are used when mounted.
var v1Controllers = []string{ctrlMemory, ctrlPids, ctrlCPU, ctrlFreezer}

const cfsPeriodUs = 100000

type v1 struct {
	memsw   bool // swap accounting is on: memory.memsw.* exist
	cpuacct bool // cpuacct is mounted with cpu, so cpuacct.usage is in the cpu dir
}

func newV1(opts Options, mounts []mount, self map[string]string) (*Manager, error) {
	m := &Manager{mode: V1}
	d := &v1{}
	var missing []string
	for _, c := range v1Controllers {
		mnt, ok := findMount(mounts, "cgroup", c)
		if !ok {
			if c == ctrlMemory || c == ctrlPids {
				missing = append(missing, c)
			}
			continue
		}
		dir, err := parentDir(opts, mnt, self[c])
		if err != nil {
			return nil, err
		}
		m.parents = append(m.parents, ctrlDir{c, dir})
		switch c {
		case ctrlMemory:
			d.memsw = exists(filepath.Join(mnt.point, "memory.memsw.limit_in_bytes"))
		case ctrlCPU:
			d.cpuacct = slices.Contains(mnt.opts, "cpuacct")
		}
	}
	if len(missing) > 0 {
		return nil, errNoController("cgroup v1", missing)
	}
	m.drv = d
	return m, nil
}

func (d *v1) setLimits(g *Group, l Limits, fresh bool) error {
	if err := d.setMemory(g.dir(ctrlMemory), l.MemoryBytes, fresh); err != nil {
		return err
	}
	if err := setPids(g.dir(ctrlPids), l.Pids, fresh); err != nil {
		return err
	}
	if err := setCPUV1(g.dir(ctrlCPU), l.CPUMillis, fresh); err != nil {
		return err
	}
	if fz := g.dir(ctrlFreezer); fz != "" && !fresh {
		return d.thaw(g) // a reused group may have been left frozen
	}
	return nil
}

func (d *v1) setMemory(dir string, limit int64, fresh bool) error {
	if fresh && limit == 0 {
		return nil
	}
	val := "-1"
	if limit > 0 {
		val = strconv.FormatInt(limit, 10)
	}
	mem := filepath.Join(dir, "memory.limit_in_bytes")
	if !d.memsw {
		if limit > 0 {
			// Best effort: without swap accounting, swappiness 0 is the
			// only way left to keep the group's anonymous memory in RAM.
			_ = writeFile(filepath.Join(dir, "memory.swappiness"), "0")
		}
		return wrapLimit(writeFile(mem, val), mem)
	}
	// The kernel keeps memsw >= limit: raise memsw first when the new
	// value is above it, else lower the plain limit first.
	memsw := filepath.Join(dir, "memory.memsw.limit_in_bytes")
	first, second := mem, memsw
	if !fresh {
		cur, err := readInt(memsw)
		if err != nil {
			return wrap(err, "cgroups: read %s", memsw)
		}
		if limit == 0 || limit > cur {
			first, second = memsw, mem
		}
	}
	if err := writeFile(first, val); err != nil {
		return wrapLimit(err, first)
	}
	return wrapLimit(writeFile(second, val), second)
}

// setPids writes pids.max, the same file on v1 and v2.
func setPids(dir string, n int64, fresh bool) error {
	if fresh && n == 0 {
		return nil
	}
	val := "max"
	if n > 0 {
		val = strconv.FormatInt(n, 10)
	}
	path := filepath.Join(dir, "pids.max")
	return wrapLimit(writeFile(path, val), path)
}

func setCPUV1(dir string, millis int64, fresh bool) error {
	if dir == "" {
		if millis > 0 {
			return errNoController("cgroup v1", []string{ctrlCPU})
		}
		return nil
	}
	if fresh && millis == 0 {
		return nil
	}
	if !fresh { // a new group starts with the kernel's default period, 100 ms
		path := filepath.Join(dir, "cpu.cfs_period_us")
		if err := writeFile(path, strconv.Itoa(cfsPeriodUs)); err != nil {
			return wrapLimit(err, path)
		}
	}
	quota := int64(-1)
	if millis > 0 {
		quota = millis * cfsPeriodUs / 1000
	}
	path := filepath.Join(dir, "cpu.cfs_quota_us")
	return wrapLimit(writeFile(path, strconv.FormatInt(quota, 10)), path)
}

// wrapLimit wraps the error of a limit write. The kernel answers EINVAL
// to a value out of its range (pids.max above PID_MAX_LIMIT, say) and EBUSY
// to a memory limit below what the group already uses.
func wrapLimit(err error, path string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("cgroups: set %s: %w: %w", filepath.Base(path), err, errdefs.ErrInvalidArgument)
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("cgroups: set %s: %w: %w", filepath.Base(path), err, errdefs.ErrFailedPrecondition)
	}
	return wrap(err, "cgroups: set %s", filepath.Base(path))
}

func (d *v1) freezerState(g *Group) (string, error) {
	dir := g.dir(ctrlFreezer)
	if dir == "" {
		return "", errNoController("cgroup v1", []string{ctrlFreezer})
	}
	return filepath.Join(dir, "freezer.state"), nil
}

// freeze writes FROZEN and polls until the kernel reports every task
// frozen. FROZEN is rewritten on each poll, as runc does: it catches tasks
// that were mid-fork or mid-migration on the first write.
func (d *v1) freeze(g *Group, deadline time.Time) error {
	path, err := d.freezerState(g)
	if err != nil {
		return err
	}
	err = poll(deadline, func() (bool, error) {
		if err := writeFile(path, "FROZEN"); err != nil {
			return false, err
		}
		b, err := readFile(path)
		return string(bytes.TrimSpace(b)) == "FROZEN", err
	})
	if err != nil {
		_ = writeFile(path, "THAWED") // don't leave it half-frozen
		return wrap(err, "cgroups: freeze %s", g.id)
	}
	return nil
}

func (d *v1) thaw(g *Group) error {
	path, err := d.freezerState(g)
	if err != nil {
		return err
	}
	return wrap(writeFile(path, "THAWED"), "cgroups: thaw %s", g.id)
}

// killAll freezes the group so nothing can fork, SIGKILLs every task, and
// thaws so the signals are delivered (frozen tasks do not die).
func (d *v1) killAll(g *Group, deadline time.Time) error {
	if g.dir(ctrlFreezer) == "" {
		return nil // no freezer: Group.killUntilEmpty's loop is the kill
	}
	soon := earliest(deadline, time.Now().Add(freezeTimeout/4))
	if err := d.freeze(g, soon); err != nil {
		return nil // stuck freezing (freeze thawed it again): same fallback
	}
	g.signalAll()
	return d.thaw(g)
}

func (d *v1) stats(g *Group) (Stats, error) {
	var r statReader
	mem, pids := g.dir(ctrlMemory), g.dir(ctrlPids)
	s := Stats{
		MemoryBytes: r.int(mem, "memory.usage_in_bytes"),
		MemoryLimit: r.int(mem, "memory.limit_in_bytes"),
		OOMKills:    r.key(mem, "memory.oom_control", "oom_kill"),
		Pids:        r.int(pids, "pids.current"),
		PidsLimit:   r.int(pids, "pids.max"),
	}
	if d.cpuacct {
		s.CPUUsageNanos = uint64(r.int(g.dir(ctrlCPU), "cpuacct.usage"))
	}
	if s.MemoryLimit >= 1<<62 { // v1 spells "unlimited" as ~LONG_MAX rounded to a page
		s.MemoryLimit = 0
	}
	return s, r.err
}

// statReader reads cgroup files, keeping the first error.
type statReader struct{ err error }

func (r *statReader) int(dir, file string) int64 {
	v, err := readInt(filepath.Join(dir, file))
	r.keep(err, file)
	return v
}

func (r *statReader) key(dir, file, key string) int64 {
	v, err := readKey(filepath.Join(dir, file), key)
	r.keep(err, file)
	return v
}

func (r *statReader) keep(err error, file string) {
	if err != nil && r.err == nil {
		r.err = wrap(err, "cgroups: stats %s", file)
	}
}
