package harden

import (
	"fmt"
	"runtime"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// deniedSyscalls fail with EPERM: what Docker's default profile withholds from
// a container without extra capabilities. Names the running architecture
// does not have (vm86 on x86_64, kexec_file_load on i386, ...) are skipped.
var deniedSyscalls = []string{
	// kernel code and modules
	"kexec_load", "kexec_file_load",
	"init_module", "finit_module", "delete_module", "create_module",
	"get_kernel_syms", "query_module",
	// large, frequently exploited kernel subsystems
	"bpf", "perf_event_open", "userfaultfd",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	// kernel keyrings are not namespaced
	"keyctl", "add_key", "request_key",
	// mounts and the new mount API; umount is i386's old umount(2),
	// open_tree_attr is open_tree plus mount_setattr (Linux 6.15)
	"mount", "umount", "umount2", "pivot_root",
	"fsopen", "fsconfig", "fsmount", "fspick",
	"move_mount", "open_tree", "open_tree_attr", "mount_setattr",
	// joining namespaces
	"setns",
	// file handles bypass path-based checks
	"open_by_handle_at", "name_to_handle_at",
	// host-wide state
	"swapon", "swapoff", "reboot", "acct",
	"quotactl", "quotactl_fd", "nfsservctl", "syslog",
	"settimeofday", "stime", "clock_settime", "clock_settime64",
	"clock_adjtime", "clock_adjtime64", "adjtimex",
	"_sysctl", "sysfs", "ustat", "lookup_dcookie", "uselib",
	// raw hardware access
	"iopl", "ioperm", "vm86", "vm86old",
}

// namespaceFlags are the clone/unshare flags that create a namespace.
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// cloneNamespaceFlags: clone(2) cannot create a time namespace. Its bit
// (0x80) lies in CSIGNAL, the exit signal, so it is not checked there.
const cloneNamespaceFlags = namespaceFlags &^ unix.CLONE_NEWTIME

// allowedPersonalities are the personality(2) arguments Docker allows:
// PER_LINUX, PER_LINUX32, PER_LINUX|UNAME26, PER_LINUX32|UNAME26 and the
// 0xffffffff query.
var allowedPersonalities = []uint64{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}

const (
	actionEPERM  = seccomp.ActionErrno                               // Program.Ret adds EPERM
	actionENOSYS = seccomp.ActionErrno | seccomp.Action(unix.ENOSYS) // returned as is
	actionKill   = seccomp.ActionKillProcess
)

// Policy returns the seccomp policy for the running architecture: allow by
// default, EPERM for deniedSyscalls, EPERM for clone and unshare with any
// namespace flag and for personality with an argument Docker does not allow,
// and ENOSYS for clone3, whose flags live in memory a filter cannot read:
// ENOSYS makes glibc and others fall back to clone, whose flags are checked.
//
// Apply loads this policy for the native ABI, preceded by a dispatch on the
// audit architecture that runs the same rules, with that ABI's syscall
// numbers, for the compat ABI (i386 on amd64, arm on arm64) and kills the
// process for any other.
func Policy() seccomp.Policy {
	info, err := arch.GetInfo("")
	if err != nil {
		info = nil
	}
	return policyFor(info)
}

// policyFor builds the policy with only the names info knows (all names when
// info is nil). Conditional rules come last and in this order on purpose: the
// library's assembler leaves an argument, not the syscall number, in the
// accumulator after a failed argument check, and later comparisons use it.
// With personality, unshare, clone last (and nothing else after them) a
// clobbered accumulator can only reach rules whose conditions evaluate the
// same argument 0 and agree; TestFilterMatchesReferenceModel checks this.
func policyFor(info *arch.Info) seccomp.Policy {
	known := func(name string) bool {
		if info == nil {
			return true
		}
		_, ok := info.SyscallNames[name]
		return ok
	}

	var denied []string
	for _, name := range deniedSyscalls {
		if known(name) {
			denied = append(denied, name)
		}
	}

	personality := make(seccomp.ArgumentConditions, 0, len(allowedPersonalities))
	for _, v := range allowedPersonalities {
		personality = append(personality, seccomp.Condition{Argument: 0, Operation: seccomp.NotEqual, Value: v})
	}
	var conditional []seccomp.NameWithConditions
	for _, nc := range []seccomp.NameWithConditions{
		{Name: "personality", Conditions: personality},
		{Name: "unshare", Conditions: seccomp.ArgumentConditions{
			{Argument: 0, Operation: seccomp.BitsSet, Value: namespaceFlags}}},
		{Name: "clone", Conditions: seccomp.ArgumentConditions{
			{Argument: 0, Operation: seccomp.BitsSet, Value: cloneNamespaceFlags}}},
	} {
		if known(nc.Name) {
			conditional = append(conditional, nc)
		}
	}

	var groups []seccomp.SyscallGroup
	if len(denied) > 0 {
		groups = append(groups, seccomp.SyscallGroup{Names: denied, Action: actionEPERM})
	}
	if known("clone3") {
		groups = append(groups, seccomp.SyscallGroup{Names: []string{"clone3"}, Action: actionENOSYS})
	}
	if len(conditional) > 0 {
		groups = append(groups, seccomp.SyscallGroup{NamesWithCondtions: conditional, Action: actionEPERM})
	}
	return seccomp.Policy{DefaultAction: seccomp.ActionAllow, Syscalls: groups}
}

// compatArch returns the second ABI the kernel runs for processes of this
// architecture, or nil.
func compatArch() *arch.Info {
	switch runtime.GOARCH {
	case "amd64":
		return arch.I386
	case "arm64":
		return arch.ARM
	}
	return nil
}

// buildFilter returns the complete program Apply loads:
//
//	load arch
//	arch == native ? -> native program (library-assembled, with its x32 guard)
//	arch == compat ? -> load nr; compat program
//	kill process
//
// The library's own program allows every syscall of a foreign architecture,
// which on amd64 would let a process bypass the policy with int $0x80.
func buildFilter() ([]bpf.Instruction, error) {
	native, err := arch.GetInfo("")
	if err != nil {
		return nil, err
	}
	p := policyFor(native)
	nat, err := p.Assemble()
	if err != nil {
		return nil, err
	}

	out := []bpf.Instruction{
		bpf.LoadAbsolute{Off: seccompDataArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(native.ID), SkipTrue: 1},
		bpf.Jump{Skip: uint32(len(nat))},
	}
	out = append(out, nat...)

	if compat := compatArch(); compat != nil && len(compat.SyscallNames) > 0 {
		cp, err := assembleFor(policyFor(compat), compat)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", compat.Name, err)
		}
		out = append(out,
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(compat.ID), SkipTrue: 1},
			bpf.RetConstant{Val: uint32(actionKill)},
			bpf.LoadAbsolute{Off: seccompDataNr, Size: 4},
		)
		out = append(out, cp...)
	} else {
		out = append(out, bpf.RetConstant{Val: uint32(actionKill)})
	}
	if len(out) > bpfMaxInsns {
		return nil, fmt.Errorf("filter has %d instructions, kernel limit is %d", len(out), bpfMaxInsns)
	}
	return out, nil
}

const (
	seccompDataNr   = 0 // offsetof(struct seccomp_data, nr)
	seccompDataArch = 4 // offsetof(struct seccomp_data, arch)
	bpfMaxInsns     = 4096
)

// assembleFor assembles p's groups for info, which need not be the running
// architecture (seccomp.Policy.Assemble only supports that one). The result
// expects the syscall number in the accumulator. It mirrors
// seccomp.SyscallGroup.Assemble, using the library's exported primitives.
func assembleFor(p seccomp.Policy, info *arch.Info) ([]bpf.Instruction, error) {
	prog := seccomp.NewProgram()
	for _, g := range p.Syscalls {
		var calls []seccomp.SyscallWithConditions
		index := map[uint32]int{}
		num := func(name string) (uint32, error) {
			n, ok := info.SyscallNames[name]
			if !ok {
				return 0, fmt.Errorf("unknown syscall %q", name)
			}
			return uint32(n | info.SeccompMask), nil
		}
		for _, name := range g.Names {
			n, err := num(name)
			if err != nil {
				return nil, err
			}
			index[n] = len(calls)
			calls = append(calls, seccomp.SyscallWithConditions{Num: n})
		}
		for _, nc := range g.NamesWithCondtions {
			n, err := num(nc.Name)
			if err != nil {
				return nil, err
			}
			if i, ok := index[n]; ok {
				calls[i].Conditions = append(calls[i].Conditions, nc.Conditions)
				continue
			}
			index[n] = len(calls)
			calls = append(calls, seccomp.SyscallWithConditions{Num: n, Conditions: []seccomp.ArgumentConditions{nc.Conditions}})
		}
		if len(calls) == 0 {
			continue
		}
		action, next := prog.NewLabel(), prog.NewLabel()
		for i, c := range calls {
			c.Assemble(&prog, i < len(calls)-1, action, next)
		}
		prog.SetLabel(action)
		prog.Ret(g.Action)
		prog.SetLabel(next)
	}
	prog.Ret(p.DefaultAction)
	return prog.Assemble()
}

// compileFilter assembles the filter into the kernel's format.
func compileFilter() ([]unix.SockFilter, error) {
	insts, err := buildFilter()
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, err
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}

// loadFilter installs the filter on every thread of the process
// (SECCOMP_FILTER_FLAG_TSYNC). no_new_privs must already be set.
func loadFilter(filter []unix.SockFilter) error {
	prog := &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	r, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(prog)))
	runtime.KeepAlive(filter)
	if e != 0 {
		return fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER, TSYNC): %w", e)
	}
	if r != 0 {
		// With TSYNC, a positive result is a thread that could not be
		// synchronized; nothing was installed.
		return fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER, TSYNC): thread %d cannot be synchronized", r)
	}
	return nil
}
