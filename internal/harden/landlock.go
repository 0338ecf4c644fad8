package harden

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Landlock is driven with raw system calls rather than through go-landlock:
// go-landlock (v0.11.2) enforces on all threads through
// kernel.org/.../libcap/psx (which, without cgo, is syscall.AllThreadsSyscall
// too), and that module is not in hutch's go.mod. The ruleset used here is a
// single rule, so the library would add little.

// landlockFSAccess lists, per Landlock ABI version, the file system access
// rights that version can handle (index = ABI version). Newer kernels get the
// newest set known here: best effort, as go-landlock's BestEffort does.
var landlockFSAccess = []uint64{
	0,
	1: 1<<13 - 1, // EXECUTE .. MAKE_SYM
	2: 1<<14 - 1, // + REFER
	3: 1<<15 - 1, // + TRUNCATE
	4: 1<<15 - 1, // (network rights only)
	5: 1<<16 - 1, // + IOCTL_DEV
	6: 1<<16 - 1, // (scopes only)
	7: 1<<16 - 1, // (audit logging only)
	8: 1<<16 - 1, // (TSYNC only)
	9: 1<<17 - 1, // + RESOLVE_UNIX
}

// LandlockABI returns the running kernel's Landlock ABI version, 0 when the
// kernel lacks Landlock or it is disabled.
func LandlockABI() int {
	r, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 {
		return 0
	}
	return int(r)
}

// applyLandlock confines file system access, on all threads, to the hierarchy
// beneath "/" (the sandbox's root): every right the kernel can handle is
// handled, and all of them are granted beneath "/" only. Files reached through
// another root (a leaked host directory fd, /proc/<pid>/root of an outside
// process) are denied. It returns the ABI version used, 0 when the kernel has
// no Landlock. no_new_privs must already be set.
func applyLandlock() (int, error) {
	abi := LandlockABI()
	if abi <= 0 {
		return 0, nil
	}
	access := landlockFSAccess[min(abi, len(landlockFSAccess)-1)]

	// Only handled_access_fs is set, so pass just that field: every ABI
	// accepts this size (x/sys's struct has grown fields newer kernels
	// know).
	attr := unix.LandlockRulesetAttr{Handled_access_fs: access}
	r, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET,
		uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr.Handled_access_fs), 0)
	if e != 0 {
		return 0, fmt.Errorf("landlock_create_ruleset: %w", e)
	}
	ruleset := int(r)
	defer unix.Close(ruleset)

	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open /: %w", err)
	}
	defer unix.Close(root)

	rule := unix.LandlockPathBeneathAttr{Allowed_access: access, Parent_fd: int32(root)}
	if _, _, e := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(ruleset),
		unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&rule)), 0, 0, 0); e != 0 {
		return 0, fmt.Errorf("landlock_add_rule(/): %w", e)
	}
	runtime.KeepAlive(&rule)

	// landlock_restrict_self applies to the calling thread only (before
	// ABI 8's TSYNC flag), so run it on every thread.
	if err := allThreads("landlock_restrict_self", unix.SYS_LANDLOCK_RESTRICT_SELF, uintptr(ruleset), 0, 0, 0, 0); err != nil {
		return 0, err
	}
	return abi, nil
}
