// Package cgroups puts each sandbox in its own cgroup so that its memory,
// process count and CPU are capped, it can be frozen, and every process it
// ever forked can be found and killed: a sandbox cannot escape its group by
// double-forking or reparenting, which is why the daemon kills and accounts
// by cgroup and not by process tree.
//
// Both cgroup v1 (legacy and hybrid hosts, where the controllers live in v1
// hierarchies) and v2 (unified) are supported. On v1 groups are made only in
// the memory, pids, cpu and freezer hierarchies; cpuset, devices, blkio and
// the rest are left alone.
//
// github.com/containerd/cgroups/v3 is used for what it does well and cheaply:
// detecting the mode and parsing /proc/self/cgroup. Its cgroup1 and cgroup2
// managers are not used: Create+Delete through cgroup1 measured 0.55 ms
// against 0.15 ms for this package's direct writes (the library's Delete
// walks every file of every controller dir; see BenchmarkCreateDelete),
// and importing them pulls protobuf, dbus, go-systemd, runtime-spec and
// cilium/ebpf into the module for what amounts to reading and writing a
// dozen small files. So everything past detection is plain file I/O.
package cgroups

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containerd/cgroups/v3"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// Mode is the cgroup version the controllers are used through.
type Mode int

const (
	// V1 is a legacy or hybrid host: controllers sit in v1 hierarchies.
	V1 Mode = iota + 1
	// V2 is a unified host: one cgroup2 hierarchy holds every controller.
	V2
)

func (m Mode) String() string {
	switch m {
	case V1:
		return "v1"
	case V2:
		return "v2"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Limits caps a group. A zero field means no limit; negative is invalid.
type Limits struct {
	// MemoryBytes caps memory, with no swap beyond it where the kernel
	// lets us: v1 memory.limit_in_bytes plus memory.memsw.limit_in_bytes
	// when swap accounting is on (else memory.swappiness 0); v2 memory.max
	// plus memory.swap.max 0.
	MemoryBytes int64
	// Pids caps the number of tasks (processes and threads): pids.max.
	Pids int64
	// CPUMillis is CPU time per wall second, 1000 = one core. At least 10
	// when set (the kernel's 1 ms minimum quota per 100 ms period).
	CPUMillis int64
}

// Stats is a snapshot of a group's usage. A zero limit means unlimited.
type Stats struct {
	MemoryBytes, MemoryLimit int64
	Pids, PidsLimit          int64
	OOMKills                 int64
	// CPUUsageNanos is 0 on v1 hosts where cpuacct is not mounted together
	// with cpu (groups are not made in a separate cpuacct hierarchy).
	CPUUsageNanos uint64
}

// Options configures a Manager.
type Options struct {
	// Parent is the cgroup path, relative to each hierarchy's mount point,
	// under which sandbox groups are made. Empty means "<the calling
	// process's own cgroup for that controller>/hutch" (nested, like
	// systemd delegation), so sandboxes count against whatever limits the
	// daemon's own cgroup has.
	Parent string
}

// Manager makes and finds sandbox groups. It is immutable after New and
// safe for concurrent use.
type Manager struct {
	mode    Mode
	parents []ctrlDir // v1: one per controller used; v2: one entry, name ""
	drv     driver
}

// ctrlDir is a controller name and a directory in its hierarchy.
type ctrlDir struct{ name, path string }

// Controller names, as in /proc/self/cgroup.
const (
	ctrlMemory  = "memory"
	ctrlPids    = "pids"
	ctrlCPU     = "cpu"
	ctrlFreezer = "freezer"
)

const defaultLeaf = "hutch"

// New detects the cgroup mode and the hierarchies to use.
func New(opts Options) (*Manager, error) {
	if err := checkParent(opts.Parent); err != nil {
		return nil, err
	}
	mounts, err := readMounts()
	if err != nil {
		return nil, err
	}
	self, unified, err := cgroups.ParseCgroupFileUnified("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroups: read own cgroup: %w", err)
	}
	switch cgroups.Mode() {
	case cgroups.Legacy, cgroups.Hybrid:
		return newV1(opts, mounts, self)
	case cgroups.Unified:
		m, ok := findMount(mounts, "cgroup2", "")
		if !ok {
			return nil, fmt.Errorf("cgroups: no cgroup2 mount in mountinfo: %w", errdefs.ErrFailedPrecondition)
		}
		return newV2(opts, m, unified, true)
	}
	return nil, fmt.Errorf("cgroups: no cgroup filesystem at /sys/fs/cgroup: %w", errdefs.ErrFailedPrecondition)
}

// checkParent rejects a Parent that could climb out of the hierarchy.
func checkParent(p string) error {
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return fmt.Errorf("cgroups: parent %q has a .. element: %w", p, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// parentDir is where groups go in mount m: opts.Parent under the mount
// point, or own/hutch with own the caller's cgroup in that hierarchy.
func parentDir(opts Options, m mount, own string) (string, error) {
	if opts.Parent != "" {
		return filepath.Join(m.point, opts.Parent), nil
	}
	dir, ok := m.dir(own)
	if !ok {
		return "", fmt.Errorf("cgroups: own cgroup %q is outside the %s mount (root %q): %w",
			own, m.point, m.root, errdefs.ErrFailedPrecondition)
	}
	return filepath.Join(dir, defaultLeaf), nil
}

// Mode reports whether groups are made in v1 hierarchies or in v2.
func (m *Manager) Mode() Mode { return m.mode }

// validID reports whether id matches [a-z0-9-]{1,64}.
func validID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func (m *Manager) group(id string) (*Group, error) {
	if !validID(id) {
		return nil, fmt.Errorf("cgroups: id %q is not [a-z0-9-]{1,64}: %w", id, errdefs.ErrInvalidArgument)
	}
	g := &Group{m: m, id: id, dirs: make([]ctrlDir, len(m.parents))}
	for i, p := range m.parents {
		g.dirs[i] = ctrlDir{p.name, filepath.Join(p.path, id)}
	}
	return g, nil
}

// maxCPUMillis (a million cores) keeps the quota arithmetic far from overflow.
const maxCPUMillis int64 = 1e9

func checkLimits(l Limits) error {
	if l.MemoryBytes < 0 || l.Pids < 0 || l.CPUMillis < 0 {
		return fmt.Errorf("cgroups: negative limit in %+v: %w", l, errdefs.ErrInvalidArgument)
	}
	if l.CPUMillis > 0 && l.CPUMillis < 10 || l.CPUMillis > maxCPUMillis {
		return fmt.Errorf("cgroups: CPUMillis %d is outside [10, %d]: %w", l.CPUMillis, maxCPUMillis, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Create makes the group id with limits l in every controller. A group
// left over from a crash is reused if it holds no process; one that does
// is an error (errdefs.ErrAlreadyExists) and is left untouched. On any
// error the directories this call made are removed again.
func (m *Manager) Create(id string, l Limits) (*Group, error) {
	g, err := m.group(id)
	if err != nil {
		return nil, err
	}
	if err := checkLimits(l); err != nil {
		return nil, err
	}
	made, fresh, err := g.mkdirs()
	if err == nil {
		err = m.drv.setLimits(g, l, fresh)
	}
	if err != nil {
		g.rmdirs(made)
		return nil, err
	}
	return g, nil
}

// Load finds a group made by an earlier Create, e.g. after a daemon
// restart. It fails with errdefs.ErrNotFound when no directory of it is left.
func (m *Manager) Load(id string) (*Group, error) {
	g, err := m.group(id)
	if err != nil {
		return nil, err
	}
	for _, d := range g.dirs {
		if exists(d.path) {
			return g, nil
		}
	}
	return nil, fmt.Errorf("cgroups: group %q: %w", id, errdefs.ErrNotFound)
}

// errNoController reports the controllers a required set lacks.
func errNoController(version string, missing []string) error {
	return fmt.Errorf("cgroups: %s controller(s) %s not available: %w",
		version, strings.Join(missing, ", "), errdefs.ErrFailedPrecondition)
}

var errNotEmpty = errors.New("group exists and holds processes")
