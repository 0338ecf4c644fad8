package harden

// Tests in this file have no side effects: they inspect the policy and run
// the assembled filter in a BPF interpreter.

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

const (
	retAllow  = uint32(unix.SECCOMP_RET_ALLOW)
	retEPERM  = uint32(unix.SECCOMP_RET_ERRNO) | uint32(unix.EPERM)
	retENOSYS = uint32(unix.SECCOMP_RET_ERRNO) | uint32(unix.ENOSYS)
	retKill   = uint32(unix.SECCOMP_RET_KILL_PROCESS)

	sigchld = uint64(unix.SIGCHLD)
)

func nativeArch(t *testing.T) *arch.Info {
	t.Helper()
	info, err := arch.GetInfo("")
	if err != nil {
		t.Skipf("go-seccomp-bpf has no syscall table for this architecture: %v", err)
	}
	return info
}

func TestPolicyDeniesDockerBlocklistKnownToThisArch(t *testing.T) {
	info := nativeArch(t)
	p := Policy()
	if p.DefaultAction != seccomp.ActionAllow {
		t.Errorf("default action = %v, want allow", p.DefaultAction)
	}
	var denied, conditional []string
	var clone3 seccomp.Action
	for _, g := range p.Syscalls {
		switch {
		case slices.Equal(g.Names, []string{"clone3"}):
			clone3 = g.Action
		case len(g.Names) > 0:
			if g.Action != seccomp.ActionErrno {
				t.Errorf("deny group action = %v, want errno (EPERM)", g.Action)
			}
			denied = append(denied, g.Names...)
		}
		for _, nc := range g.NamesWithCondtions {
			conditional = append(conditional, nc.Name)
		}
	}
	for _, name := range deniedSyscalls {
		_, known := info.SyscallNames[name]
		if got := slices.Contains(denied, name); got != known {
			t.Errorf("%s: in policy = %v, known to %s = %v", name, got, info.Name, known)
		}
	}
	for _, name := range []string{"mount", "bpf", "keyctl", "io_uring_setup", "setns", "open_by_handle_at"} {
		if !slices.Contains(denied, name) {
			t.Errorf("%s is not denied", name)
		}
	}
	for _, name := range []string{"kcmp", "ptrace", "clone", "unshare", "personality", "clone3"} {
		if slices.Contains(denied, name) {
			t.Errorf("%s is denied unconditionally", name)
		}
	}
	if want := []string{"personality", "unshare", "clone"}; !slices.Equal(conditional, want) {
		t.Errorf("conditional rules = %v, want %v (order matters, see policyFor)", conditional, want)
	}
	if uint32(clone3) != retENOSYS {
		t.Errorf("clone3 action = %#x, want %#x (errno ENOSYS)", uint32(clone3), retENOSYS)
	}
	t.Logf("%s: %d syscalls denied: %s", info.Name, len(denied), strings.Join(denied, " "))
}

func TestClone3ENOSYSActionSurvivesAssembly(t *testing.T) {
	nativeArch(t)
	p := Policy()
	insts, err := p.Assemble()
	if err != nil {
		t.Fatalf("library rejects the policy: %v", err)
	}
	var rets []uint32
	for _, in := range insts {
		if r, ok := in.(bpf.RetConstant); ok {
			rets = append(rets, r.Val)
		}
	}
	// Program.Ret adds EPERM only to a bare ActionErrno; errno|ENOSYS must
	// come through unchanged.
	for _, want := range []uint32{retENOSYS, retEPERM, retAllow} {
		if !slices.Contains(rets, want) {
			t.Errorf("assembled policy has no RET %#x (has %#x)", want, rets)
		}
	}
}

// seccompData encodes struct seccomp_data for the x/net/bpf interpreter,
// which loads 32-bit words big-endian: each word is stored so that the
// interpreter sees the value the kernel would see on a little-endian
// machine, with the low half of each 64-bit argument first.
func seccompData(nr int, auditArch uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[0:], uint32(nr))
	binary.BigEndian.PutUint32(b[4:], auditArch)
	for i, a := range args {
		off := 16 + 8*i
		binary.BigEndian.PutUint32(b[off:], uint32(a))
		binary.BigEndian.PutUint32(b[off+4:], uint32(a>>32))
	}
	return b
}

// expectedAction is the reference model of the filter: what the kernel
// must return for syscall name with argument 0 arg0.
func expectedAction(name string, arg0 uint64) uint32 {
	switch {
	case slices.Contains(deniedSyscalls, name):
		return retEPERM
	case name == "clone3":
		return retENOSYS
	case name == "clone" && uint32(arg0)&cloneNamespaceFlags != 0:
		return retEPERM
	case name == "unshare" && uint32(arg0)&namespaceFlags != 0:
		return retEPERM
	case name == "personality" && !slices.Contains(allowedPersonalities, arg0):
		return retEPERM
	}
	return retAllow
}

// TestFilterMatchesReferenceModel runs the complete filter Apply loads in a
// BPF interpreter, for every syscall number of the native and the compat
// ABI, with argument values that exercise every conditional rule (including
// values equal to syscall numbers, which would expose a clobbered
// accumulator), for x32 and for a foreign architecture.
func TestFilterMatchesReferenceModel(t *testing.T) {
	native := nativeArch(t)
	insts, err := buildFilter()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bpf.Assemble(insts); err != nil {
		t.Fatalf("filter does not assemble: %v", err)
	}
	vm, err := bpf.NewVM(insts)
	if err != nil {
		t.Fatalf("filter rejected by interpreter: %v", err)
	}
	t.Logf("filter: %d instructions", len(insts))
	run := func(data []byte) uint32 {
		t.Helper()
		r, err := vm.Run(data)
		if err != nil {
			t.Fatalf("interpreter: %v", err)
		}
		return uint32(r)
	}

	arg0s := []uint64{0, 8, 0x20000, 0x20008, 0xffffffff, 0xffffffffffffffff, 0x40000, 1 << 32,
		sigchld, unix.CLONE_VM | unix.CLONE_VFORK | sigchld,
		unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD |
			unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID,
		unix.CLONE_NEWTIME, unix.CLONE_NEWTIME | sigchld, unix.CLONE_FS, unix.CLONE_FILES,
	}
	for bit := 0; bit < 32; bit++ {
		arg0s = append(arg0s, 1<<bit)
	}
	arches := []*arch.Info{native}
	if c := compatArch(); c != nil && len(c.SyscallNames) > 0 {
		arches = append(arches, c)
	}
	for _, a := range arches {
		// Argument values equal to this ABI's syscall numbers.
		vals := slices.Clone(arg0s)
		for _, n := range []string{"clone", "unshare", "personality", "mount", "clone3", "bpf"} {
			if nr, ok := a.SyscallNames[n]; ok {
				vals = append(vals, uint64(nr))
			}
		}
		for nr := 0; nr < 1024; nr++ {
			name := a.SyscallNumbers[nr]
			for _, v := range vals {
				want := expectedAction(name, v)
				if got := run(seccompData(nr|a.SeccompMask, uint32(a.ID), v)); got != want {
					t.Errorf("%s %d (%s) arg0=%#x: got %#x, want %#x", a.Name, nr, name, v, got, want)
				}
			}
		}
	}
	if native.ID == arch.X86_64.ID {
		for _, name := range []string{"read", "mount", "clone"} {
			nr := arch.X32.SyscallNames[name]
			if got := run(seccompData(nr|arch.X32.SeccompMask, uint32(native.ID))); got != retENOSYS {
				t.Errorf("x32 %s: got %#x, want ENOSYS", name, got)
			}
		}
	}
	if got := run(seccompData(0, 0xdeadbeef)); got != retKill {
		t.Errorf("foreign architecture: got %#x, want kill process", got)
	}
}

func TestCapabilityNamesAreCheckedAndNormalized(t *testing.T) {
	def, err := capSet(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(def.names()), len(DefaultCaps()); got != want {
		t.Fatalf("default set has %d capabilities, want %d", got, want)
	}
	for _, name := range DefaultCaps() {
		if _, ok := capNumbers[name]; !ok {
			t.Errorf("DefaultCaps has unknown name %s", name)
		}
	}
	m, err := capSet([]string{"CAP_SYS_PTRACE", "sys_nice", "cap_net_admin"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []int{unix.CAP_SYS_PTRACE, unix.CAP_SYS_NICE, unix.CAP_NET_ADMIN} {
		if m&(1<<c) == 0 {
			t.Errorf("capability %d missing from %v", c, m.names())
		}
	}
	if m&^def != 1<<unix.CAP_SYS_PTRACE|1<<unix.CAP_SYS_NICE|1<<unix.CAP_NET_ADMIN {
		t.Errorf("extra caps changed more than asked: %v", m.names())
	}
	_, err = capSet([]string{"CAP_SYS_PTRACE", "CAP_TELEPORT", "CAP_"})
	if err == nil || !strings.Contains(err.Error(), "CAP_TELEPORT") {
		t.Errorf("unknown capability: err = %v, want one naming CAP_TELEPORT", err)
	}
}
