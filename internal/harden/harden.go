// Package harden locks down a sandbox's init process, and therefore every
// process it will ever spawn, right before the untrusted workload starts.
//
// A hutch sandbox runs AI-written code as root inside a user namespace. The
// namespaces alone are the only wall between that code and the host kernel,
// and the kernel exposes a very large attack surface to a process that is root
// in its own user namespace: it may create further namespaces, mount
// filesystems, load BPF programs, set up io_uring, and so on; many container
// escapes went through exactly those doors. This package closes them the way
// container runtimes do, in layers, so that one mistake does not open the
// sandbox:
//
//   - capabilities: everything outside a small, Docker-like default set is
//     removed from the bounding, permitted, effective and inheritable sets
//     (and ambient capabilities are cleared), so no descendant can regain it;
//   - no_new_privs: setuid binaries and file capabilities cannot raise
//     privileges again;
//   - seccomp: a default-allow filter denies the system calls Docker's default
//     profile denies (module loading, mount and namespace creation, BPF,
//     keyrings, io_uring, clock setting, ...), for the native ABI and for the
//     32-bit compat ABI alike;
//   - Landlock (optional): file system access is confined to the hierarchy
//     beneath the sandbox's own "/", so a path reached through a leaked host
//     file descriptor or through /proc/<pid>/root of an outside process is
//     denied even if every other layer failed.
//
// Apply changes the calling process irreversibly. init is a multi-threaded Go
// program and most of these settings are per thread, so every step is applied
// to all threads (syscall.AllThreadsSyscall, which works because hutch is
// built with CGO_ENABLED=0, and SECCOMP_FILTER_FLAG_TSYNC for the filter).
package harden

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// Config selects optional hardening.
type Config struct {
	// Landlock restricts file system access to the hierarchy under "/" of
	// the sandbox's (already pivoted) root, best effort: kernels without
	// Landlock are accepted silently.
	Landlock bool
	// ExtraCaps adds capabilities to the default set (names like
	// "CAP_SYS_PTRACE"; case and the "CAP_" prefix are optional). Unknown
	// names are an error.
	ExtraCaps []string
}

// Report says what Apply put in place. After an error it describes the steps
// that completed before the failure.
type Report struct {
	Seccomp     bool     // the seccomp filter is loaded on all threads
	NoNewPrivs  bool     // no_new_privs is set on all threads
	Caps        []string // the capabilities kept, in capability-number order
	LandlockABI int      // Landlock ABI enforced; 0 = not applied/not available
}

// Prepared is hardening half done: validated, the seccomp filter compiled,
// the bounding set dropped. What is left takes a few system calls.
type Prepared struct {
	set    capMask
	filter []unix.SockFilter
}

// Prepare validates cfg, compiles the seccomp filter and drops the
// bounding set on all threads: the slow part of hardening, which leaves
// the process able to mount and pivot. A parked init runs it before it is
// claimed.
func Prepare(cfg Config) (*Prepared, error) {
	set, err := capSet(cfg.ExtraCaps)
	if err != nil {
		return nil, err
	}
	if err := checkHeld(set); err != nil {
		return nil, err
	}
	filter, err := compileFilter()
	if err != nil {
		return nil, fmt.Errorf("harden: seccomp filter: %w", err)
	}
	if err := dropBounding(set); err != nil {
		return nil, fmt.Errorf("harden: capabilities: %w", err)
	}
	return &Prepared{set: set, filter: filter}, nil
}

// Apply hardens the calling process and everything it spawns later. It must be
// called once, by a process that still holds CAP_SETPCAP (init, root in its
// user namespace), after all mounts and pivot_root are done.
//
// Order: bounding set, capability sets and ambient set, no_new_privs, seccomp
// (TSYNC), Landlock. Config is validated before anything is changed.
func Apply(cfg Config) (Report, error) {
	p, err := Prepare(cfg)
	if err != nil {
		return Report{}, err
	}
	return p.Apply(cfg.Landlock)
}

// Apply finishes what Prepare started: capability sets, no_new_privs,
// seccomp (TSYNC), then Landlock if asked.
func (p *Prepared) Apply(landlock bool) (Report, error) {
	var rep Report
	if err := applyCaps(p.set); err != nil {
		return rep, fmt.Errorf("harden: capabilities: %w", err)
	}
	rep.Caps = p.set.names()

	if err := allThreads("prctl(PR_SET_NO_NEW_PRIVS)", syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return rep, fmt.Errorf("harden: %w", err)
	}
	rep.NoNewPrivs = true

	if err := loadFilter(p.filter); err != nil {
		return rep, fmt.Errorf("harden: seccomp: %w", err)
	}
	rep.Seccomp = true

	if landlock {
		abi, err := applyLandlock()
		if err != nil {
			return rep, fmt.Errorf("harden: landlock: %w", err)
		}
		rep.LandlockABI = abi
	}
	return rep, nil
}

// allThreads runs a system call on every thread of the process, all or none
// (the runtime stops the world; it aborts the program if threads disagree).
// Like syscall.AllThreadsSyscall, it is marked uintptrescapes: a pointer
// converted to uintptr in the call is moved to the heap and kept alive.
//
//go:uintptrescapes
func allThreads(what string, trap, a1, a2, a3, a4, a5 uintptr) error {
	_, _, e := syscall.AllThreadsSyscall6(trap, a1, a2, a3, a4, a5, 0)
	switch e {
	case 0:
		return nil
	case syscall.ENOTSUP:
		// The runtime cannot reach threads started by C code.
		return fmt.Errorf("%s on all threads: %w (binary built with cgo; build with CGO_ENABLED=0)", what, e)
	}
	return fmt.Errorf("%s: %w", what, e)
}
