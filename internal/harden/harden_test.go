package harden

// Apply changes the calling process irreversibly, so every test that calls it
// re-executes the test binary with HARDEN_TEST_CHILD=<case>; TestMain runs
// that case instead of the tests. A child prints "ok"/"FAIL"/"info" lines and
// exits 0 (passed), 1 (failed) or 3 (skipped, reason on the last line).

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/harden/internal/int80"
)

const childEnv = "HARDEN_TEST_CHILD"

// addrNoRandomize is ADDR_NO_RANDOMIZE, a personality Docker does not allow.
const addrNoRandomize = 0x0040000

const (
	exitPass = 0
	exitFail = 1
	exitSkip = 3
)

func TestMain(m *testing.M) {
	if name := os.Getenv(childEnv); name != "" {
		os.Exit(runChild(name))
	}
	os.Exit(m.Run())
}

// childOpts configure how the parent starts a child.
type childOpts struct {
	env      []string
	newMntNS bool // run the child in a new mount namespace
}

// startChild runs the test binary as child case name and fails or skips t
// according to its exit code.
func startChild(t *testing.T, name string, o childOpts) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (capabilities to drop)")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+name)
	cmd.Env = append(cmd.Env, o.env...)
	if o.newMntNS {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	}
	out, err := cmd.CombinedOutput()
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		t.Log(line)
	}
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("child %s: %v", name, err)
		}
		code = ee.ExitCode()
	}
	switch code {
	case exitPass:
	case exitSkip:
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		t.Skip(lines[len(lines)-1])
	default:
		t.Fatalf("child %s failed (exit %d)", name, code)
	}
}

func TestApplyWithDefaultsBlocksEscapeSyscallsOnAllThreadsAndKeepsProcessesWorking(t *testing.T) {
	startChild(t, "defaults", childOpts{})
}

func TestSeccompAloneBlocksMountAndNamespacesEvenWithCapSysAdmin(t *testing.T) {
	// New mount namespace: if the filter failed, the mount attempted here
	// must not land in the host's namespace.
	startChild(t, "sysadmin", childOpts{newMntNS: true, env: []string{"HARDEN_TEST_DIR=" + t.TempDir()}})
}

func TestSeccompAlsoFiltersI386CompatSyscalls(t *testing.T) {
	if !int80.Available {
		t.Skip("int $0x80 helper only exists on amd64")
	}
	startChild(t, "compat", childOpts{})
}

func TestLandlockAllowsEverythingBeneathRoot(t *testing.T) {
	startChild(t, "landlock-root", childOpts{env: []string{"HARDEN_TEST_DIR=" + t.TempDir()}})
}

func TestLandlockDeniesPathsOutsideSandboxRootOnAllThreads(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "inside.txt"), []byte("inside\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "proc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "outside.txt"), []byte("outside\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	startChild(t, "landlock-chroot", childOpts{newMntNS: true, env: []string{
		"HARDEN_TEST_ROOT=" + root, "HARDEN_TEST_OUTSIDE=" + filepath.Join(outside, "outside.txt"),
	}})
}

func TestUnknownExtraCapIsRejectedBeforeAnythingChanges(t *testing.T) {
	startChild(t, "unknown-cap", childOpts{})
}

func TestExtraCapNotHeldIsRejectedBeforeAnythingChanges(t *testing.T) {
	startChild(t, "unheld-cap", childOpts{})
}

func TestLandlockABIOfThisKernel(t *testing.T) {
	abi := LandlockABI()
	if abi == 0 {
		t.Skip("kernel has no Landlock")
	}
	t.Logf("Landlock ABI %d", abi)
}

// ---- child side ----

// checker collects the results of one child case.
type checker struct{ failed bool }

func (c *checker) ok(format string, args ...any) { fmt.Printf("ok    "+format+"\n", args...) }

func (c *checker) fail(format string, args ...any) {
	c.failed = true
	fmt.Printf("FAIL  "+format+"\n", args...)
}

func (c *checker) info(format string, args ...any) { fmt.Printf("info  "+format+"\n", args...) }

func (c *checker) check(cond bool, format string, args ...any) {
	if cond {
		c.ok(format, args...)
	} else {
		c.fail(format, args...)
	}
}

// errno checks that err is the errno want (0 = success).
func (c *checker) errno(what string, err error, want syscall.Errno) {
	var got syscall.Errno
	if err != nil && !errors.As(err, &got) {
		c.fail("%s: %v, want %v", what, err, errName(want))
		return
	}
	c.check(got == want, "%s: %s (want %s)", what, errName(got), errName(want))
}

func errName(e syscall.Errno) string {
	if e == 0 {
		return "success"
	}
	return unix.ErrnoName(e)
}

func rawErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

type skipError string

func (s skipError) Error() string { return string(s) }

func runChild(name string) int {
	cases := map[string]func(*checker) error{
		"defaults":        childDefaults,
		"sysadmin":        childSysAdmin,
		"compat":          childCompat,
		"landlock-root":   childLandlockRoot,
		"landlock-chroot": childLandlockChroot,
		"unknown-cap":     childUnknownCap,
		"unheld-cap":      childUnheldCap,
	}
	f, ok := cases[name]
	if !ok {
		fmt.Printf("FAIL  unknown child case %q\n", name)
		return exitFail
	}
	c := &checker{}
	if err := f(c); err != nil {
		var skip skipError
		if errors.As(err, &skip) {
			fmt.Println(string(skip))
			return exitSkip
		}
		fmt.Printf("FAIL  %v\n", err)
		return exitFail
	}
	if c.failed {
		return exitFail
	}
	return exitPass
}

// lockedThreads are goroutines locked to their own OS threads, so that a
// check can run on each of several distinct threads.
type lockedThreads struct {
	work []chan func()
	done chan int
}

func startLockedThreads(n int) *lockedThreads {
	lt := &lockedThreads{done: make(chan int)}
	ready := make(chan struct{})
	for i := 0; i < n; i++ {
		ch := make(chan func())
		lt.work = append(lt.work, ch)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
			ready <- struct{}{}
			for f := range ch {
				f()
				lt.done <- unix.Gettid()
			}
		}()
		<-ready
	}
	return lt
}

// onEach runs f on every locked thread, one after the other, and returns the
// thread ids.
func (lt *lockedThreads) onEach(f func()) []int {
	var tids []int
	for _, ch := range lt.work {
		ch <- f
		tids = append(tids, <-lt.done)
	}
	return tids
}

func (lt *lockedThreads) stop() {
	for _, ch := range lt.work {
		close(ch)
	}
}

// procStatus parses a /proc/.../status file.
func procStatus(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m, nil
}

func capField(st map[string]string, key string) capMask {
	v, err := strconv.ParseUint(st[key], 16, 64)
	if err != nil {
		return ^capMask(0)
	}
	return capMask(v)
}

// checkStatus checks one status file against the expected hardened state.
func checkStatus(c *checker, who string, st map[string]string, want capMask) {
	ok := st["Seccomp"] == "2" && st["NoNewPrivs"] == "1" &&
		capField(st, "CapBnd") == want && capField(st, "CapEff") == want &&
		capField(st, "CapPrm") == want && capField(st, "CapInh") == want &&
		capField(st, "CapAmb") == 0
	c.check(ok, "%s: Seccomp=%s NoNewPrivs=%s CapBnd=%s CapEff=%s CapPrm=%s CapInh=%s CapAmb=%s (want 2, 1, %016x x4, 0)",
		who, st["Seccomp"], st["NoNewPrivs"], st["CapBnd"], st["CapEff"], st["CapPrm"], st["CapInh"], st["CapAmb"], uint64(want))
}

// checkAllThreads checks every thread of this process and returns how many
// there are.
func checkAllThreads(c *checker, want capMask) int {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		c.fail("read /proc/self/task: %v", err)
		return 0
	}
	for _, task := range tasks {
		st, err := procStatus(filepath.Join("/proc/self/task", task.Name(), "status"))
		if err != nil {
			c.fail("thread %s: %v", task.Name(), err)
			continue
		}
		checkStatus(c, "thread "+task.Name(), st, want)
	}
	return len(tasks)
}

func childDefaults(c *checker) error {
	want, err := capSet(nil)
	if err != nil {
		return err
	}
	before := startLockedThreads(4)
	defer before.stop()

	rep, err := Apply(Config{})
	if err != nil {
		return err
	}
	c.info("report: %+v", rep)
	c.check(rep.Seccomp && rep.NoNewPrivs && rep.LandlockABI == 0, "report: Seccomp, NoNewPrivs set, no Landlock")
	c.check(slices.Equal(rep.Caps, want.names()), "report.Caps = %v", rep.Caps)
	sorted := slices.Clone(DefaultCaps())
	slices.Sort(sorted)
	got := slices.Clone(rep.Caps)
	slices.Sort(got)
	c.check(slices.Equal(got, sorted), "report.Caps are DefaultCaps")

	after := startLockedThreads(4)
	defer after.stop()
	n := checkAllThreads(c, want)
	c.check(n >= 9, "%d threads checked (4 locked before Apply, 4 after, main)", n)

	// mount: the target does not exist, so without the filter the kernel
	// would answer ENOENT (path lookup comes before the capability check).
	c.errno("mount(tmpfs, /nonexistent)", unix.Mount("none", "/nonexistent-harden-test/x", "tmpfs", 0, ""), unix.EPERM)
	// Without the filter: EINVAL (multi-threaded process).
	c.errno("unshare(CLONE_NEWUSER)", unix.Unshare(unix.CLONE_NEWUSER), unix.EPERM)
	for _, f := range []struct {
		name string
		flag int
	}{
		{"CLONE_NEWNS", unix.CLONE_NEWNS}, {"CLONE_NEWUTS", unix.CLONE_NEWUTS},
		{"CLONE_NEWIPC", unix.CLONE_NEWIPC}, {"CLONE_NEWPID", unix.CLONE_NEWPID},
		{"CLONE_NEWNET", unix.CLONE_NEWNET}, {"CLONE_NEWCGROUP", unix.CLONE_NEWCGROUP},
		{"CLONE_NEWTIME", unix.CLONE_NEWTIME},
	} {
		c.errno("unshare("+f.name+")", unix.Unshare(f.flag), unix.EPERM)
		// CLONE_THREAD without CLONE_SIGHAND: the kernel itself would
		// answer EINVAL before creating anything.
		if f.flag != unix.CLONE_NEWTIME {
			_, _, e := unix.RawSyscall(unix.SYS_CLONE, uintptr(f.flag|unix.CLONE_THREAD), 0, 0)
			c.errno("clone("+f.name+"|CLONE_THREAD)", rawErr(e), unix.EPERM)
		}
	}
	_, _, e := unix.RawSyscall(unix.SYS_CLONE, unix.CLONE_NEWUSER|unix.CLONE_THREAD, 0, 0)
	c.errno("clone(CLONE_NEWUSER|CLONE_THREAD)", rawErr(e), unix.EPERM)
	_, _, e = unix.RawSyscall(unix.SYS_CLONE, unix.CLONE_THREAD, 0, 0)
	c.errno("clone(CLONE_THREAD) reaches the kernel", rawErr(e), unix.EINVAL)
	c.errno("unshare(0) is allowed", unix.Unshare(0), 0)

	// Without the filter: EFAULT/EINVAL.
	_, _, e = unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
	c.errno("clone3(NULL, 0)", rawErr(e), unix.ENOSYS)

	_, _, e = unix.Syscall(unix.SYS_BPF, 5 /* BPF_PROG_LOAD */, 0, 0)
	c.errno("bpf(BPF_PROG_LOAD)", rawErr(e), unix.EPERM)
	_, err = unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	c.errno("keyctl(KEYCTL_GET_KEYRING_ID)", err, unix.EPERM)
	_, _, e = unix.Syscall(unix.SYS_IO_URING_SETUP, 1, 0, 0)
	c.errno("io_uring_setup", rawErr(e), unix.EPERM)
	c.errno("setns(-1)", unix.Setns(-1, 0), unix.EPERM)
	_, err = unix.Fsopen("tmpfs", 0)
	c.errno("fsopen(tmpfs)", err, unix.EPERM)
	c.errno("pivot_root", unix.PivotRoot("/nonexistent-a", "/nonexistent-b"), unix.EPERM)
	_, _, e = unix.Syscall(unix.SYS_PERF_EVENT_OPEN, 0, 0, 0)
	c.errno("perf_event_open", rawErr(e), unix.EPERM)
	_, _, e = unix.Syscall(unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), 0, 0)
	c.errno("open_by_handle_at", rawErr(e), unix.EPERM)
	tv := unix.Timeval{}
	c.errno("settimeofday", unix.Settimeofday(&tv), unix.EPERM)
	_, _, e = unix.Syscall(unix.SYS_KCMP, uintptr(os.Getpid()), uintptr(os.Getpid()), 0 /* KCMP_FILE */)
	c.check(e != unix.EPERM, "kcmp is allowed: %s", errName(e))

	r, _, e := unix.Syscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
	c.errno(fmt.Sprintf("personality(0xffffffff) = %#x", r), rawErr(e), 0)
	_, _, e = unix.Syscall(unix.SYS_PERSONALITY, addrNoRandomize, 0, 0)
	c.errno("personality(ADDR_NO_RANDOMIZE)", rawErr(e), unix.EPERM)

	// Spawning still works, and the result is inherited.
	err = exec.Command("/bin/true").Run()
	c.check(err == nil, "exec /bin/true: %v", err)
	out, err := exec.Command("/bin/sh", "-c", "sleep 0 & wait; echo done").CombinedOutput()
	c.check(err == nil && strings.TrimSpace(string(out)) == "done", "sh -c 'sleep 0 & wait': %v %q", err, out)
	out, err = exec.Command("/bin/sh", "-c", "cat /proc/self/status").Output()
	if err != nil {
		c.fail("cat /proc/self/status: %v", err)
	} else {
		st := map[string]string{}
		for _, line := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				st[k] = strings.TrimSpace(v)
			}
		}
		checkStatus(c, "exec'd grandchild", st, want)
	}
	// glibc's pthread_create tries clone3 first and falls back to clone
	// on ENOSYS.
	if perl, err := exec.LookPath("perl"); err == nil && exec.Command(perl, "-Mthreads", "-e", "1").Run() == nil {
		out, err := exec.Command(perl, "-Mthreads", "-e", "print threads->create(sub { 42 })->join").CombinedOutput()
		c.check(err == nil && string(out) == "42", "glibc pthread_create (perl threads) falls back to clone: %v %q", err, out)
	} else {
		c.info("perl with threads not available; glibc clone3 fallback not exercised")
	}
	return nil
}

func childSysAdmin(c *checker) error {
	dir := os.Getenv("HARDEN_TEST_DIR")
	// Keep anything that might get mounted out of the host's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	rep, err := Apply(Config{ExtraCaps: []string{"CAP_SYS_ADMIN"}})
	if err != nil {
		return err
	}
	c.check(slices.Contains(rep.Caps, "CAP_SYS_ADMIN"), "report.Caps has CAP_SYS_ADMIN: %v", rep.Caps)
	st, err := procStatus("/proc/self/status")
	if err != nil {
		return err
	}
	c.check(capField(st, "CapEff")&(1<<unix.CAP_SYS_ADMIN) != 0, "CapEff %s has CAP_SYS_ADMIN", st["CapEff"])

	// With CAP_SYS_ADMIN each of these would succeed; only the filter
	// stops them.
	err = unix.Mount("none", dir, "tmpfs", 0, "")
	if err == nil {
		unix.Unmount(dir, unix.MNT_DETACH)
	}
	c.errno("mount(tmpfs) with CAP_SYS_ADMIN", err, unix.EPERM)
	c.errno("umount2(/proc) with CAP_SYS_ADMIN", unix.Unmount("/proc", unix.MNT_DETACH), unix.EPERM)
	lt := startLockedThreads(1)
	defer lt.stop()
	lt.onEach(func() {
		c.errno("unshare(CLONE_NEWNET) with CAP_SYS_ADMIN", unix.Unshare(unix.CLONE_NEWNET), unix.EPERM)
		fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			c.fail("open /proc/self/ns/net: %v", err)
			return
		}
		defer unix.Close(fd)
		c.errno("setns(own netns) with CAP_SYS_ADMIN", unix.Setns(fd, unix.CLONE_NEWNET), unix.EPERM)
	})
	_, err = unix.Fsopen("tmpfs", 0)
	c.errno("fsopen(tmpfs) with CAP_SYS_ADMIN", err, unix.EPERM)
	return nil
}

// childCompat issues i386 system calls with int $0x80. A filter that only
// knows the native ABI would let all of them through.
func childCompat(c *checker) error {
	if _, err := Apply(Config{}); err != nil {
		return err
	}
	nr := func(name string) uint32 { return uint32(arch.I386.SyscallNames[name]) }
	sys := func(name string, args ...uint32) syscall.Errno {
		var a [5]uint32
		copy(a[:], args)
		r := int80.Syscall(nr(name), a[0], a[1], a[2], a[3], a[4])
		if r < 0 && r > -4096 {
			return syscall.Errno(-r)
		}
		return 0
	}
	if pid := int80.Syscall(nr("getpid"), 0, 0, 0, 0, 0); int(pid) != os.Getpid() {
		return skipError(fmt.Sprintf("kernel does not run i386 syscalls (IA32 emulation off?): getpid via int $0x80 = %d", pid))
	}
	c.ok("getpid via int $0x80 is allowed")
	c.errno("i386 unshare(CLONE_NEWUSER)", rawErr(sys("unshare", unix.CLONE_NEWUSER)), unix.EPERM)
	c.errno("i386 unshare(CLONE_NEWNS)", rawErr(sys("unshare", unix.CLONE_NEWNS)), unix.EPERM)
	c.errno("i386 clone(CLONE_NEWUSER|CLONE_THREAD)", rawErr(sys("clone", unix.CLONE_NEWUSER|unix.CLONE_THREAD)), unix.EPERM)
	c.errno("i386 clone(CLONE_THREAD) reaches the kernel", rawErr(sys("clone", unix.CLONE_THREAD)), unix.EINVAL)
	c.errno("i386 mount", rawErr(sys("mount")), unix.EPERM)
	c.errno("i386 umount", rawErr(sys("umount")), unix.EPERM)
	c.errno("i386 clone3", rawErr(sys("clone3")), unix.ENOSYS)
	c.errno("i386 keyctl", rawErr(sys("keyctl")), unix.EPERM)
	c.errno("i386 bpf", rawErr(sys("bpf", 5)), unix.EPERM)
	c.errno("i386 io_uring_setup", rawErr(sys("io_uring_setup", 1)), unix.EPERM)
	c.errno("i386 personality(0xffffffff)", rawErr(sys("personality", 0xffffffff)), 0)
	c.errno("i386 personality(ADDR_NO_RANDOMIZE)", rawErr(sys("personality", addrNoRandomize)), unix.EPERM)
	return nil
}

func childLandlockRoot(c *checker) error {
	if LandlockABI() == 0 {
		return skipError("kernel has no Landlock")
	}
	rep, err := Apply(Config{Landlock: true})
	if err != nil {
		return err
	}
	c.info("Landlock ABI %d", rep.LandlockABI)
	c.check(rep.LandlockABI > 0, "report.LandlockABI = %d", rep.LandlockABI)
	_, err = os.ReadFile("/etc/hostname")
	c.check(err == nil, "read /etc/hostname: %v", err)
	f := filepath.Join(os.Getenv("HARDEN_TEST_DIR"), "new", "file")
	err = os.MkdirAll(filepath.Dir(f), 0o755)
	if err == nil {
		err = os.WriteFile(f, []byte("x"), 0o644)
	}
	if err == nil {
		err = os.Rename(f, f+".renamed")
	}
	if err == nil {
		err = os.Truncate(f+".renamed", 0)
	}
	c.check(err == nil, "mkdir, create, rename, truncate under a temp dir: %v", err)
	fd, err := unix.Open("/dev/null", unix.O_RDWR, 0)
	c.check(err == nil, "open /dev/null read-write: %v", err)
	if err == nil {
		unix.Close(fd)
	}
	err = exec.Command("/bin/sh", "-c", "ls / >/dev/null && echo hi | cat >/dev/null").Run()
	c.check(err == nil, "exec sh with a pipeline: %v", err)
	return nil
}

// childLandlockChroot plays init: it chroots into a prepared directory (as
// init pivot_roots) while holding descriptors from outside, then applies
// Landlock.
func childLandlockChroot(c *checker) error {
	if LandlockABI() == 0 {
		return skipError("kernel has no Landlock")
	}
	root, outsideFile := os.Getenv("HARDEN_TEST_ROOT"), os.Getenv("HARDEN_TEST_OUTSIDE")
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", 0, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	hostRoot, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	hostFile, err := unix.Open(outsideFile, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return err
	}
	threads := startLockedThreads(4)
	defer threads.stop()

	if err := unix.Chroot(root); err != nil {
		return err
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	rep, err := Apply(Config{Landlock: true})
	if err != nil {
		return err
	}
	c.info("Landlock ABI %d", rep.LandlockABI)
	c.check(rep.LandlockABI > 0, "report.LandlockABI = %d", rep.LandlockABI)

	b, err := os.ReadFile("/inside.txt")
	c.check(err == nil && string(b) == "inside\n", "read /inside.txt beneath the root: %v", err)
	err = os.WriteFile("/created.txt", []byte("x"), 0o644)
	c.check(err == nil, "create /created.txt beneath the root: %v", err)

	rel := strings.TrimPrefix(outsideFile, "/")
	tids := threads.onEach(func() {
		fd, err := unix.Openat(hostRoot, rel, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		c.errno(fmt.Sprintf("thread %d: openat(leaked host root fd, %s)", unix.Gettid(), rel), err, unix.EACCES)
	})
	c.check(len(slices.Compact(slices.Sorted(slices.Values(tids)))) == 4, "checked on 4 distinct threads %v", tids)
	fd, err := unix.Openat(hostRoot, "etc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
	}
	c.errno("open directory through leaked host root fd", err, unix.EACCES)

	// Already-open descriptors keep working...
	buf := make([]byte, 64)
	n, err := unix.Pread(hostFile, buf, 0)
	c.check(err == nil && string(buf[:n]) == "outside\n", "read already-open host file fd: %v", err)
	// ...but reopening one through /proc/self/fd resolves to a path outside
	// the root (this is what /dev/stdin does for a host-side file or pty).
	fd, err = unix.Open(fmt.Sprintf("/proc/self/fd/%d", hostFile), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
	}
	c.errno("reopen host file via /proc/self/fd", err, unix.EACCES)
	// Pipes live on an internal file system Landlock does not restrict.
	fd, err = unix.Open(fmt.Sprintf("/proc/self/fd/%d", p[0]), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
	}
	c.errno("reopen pipe via /proc/self/fd", err, 0)
	return nil
}

func childUnknownCap(c *checker) error {
	rep, err := Apply(Config{ExtraCaps: []string{"CAP_SYS_PTRACE", "CAP_TELEPORT"}})
	c.check(err != nil && strings.Contains(err.Error(), "CAP_TELEPORT"), "Apply error names the unknown cap: %v", err)
	c.check(!rep.Seccomp && !rep.NoNewPrivs && rep.Caps == nil, "report is empty: %+v", rep)
	checkUnchanged(c)
	return nil
}

func childUnheldCap(c *checker) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	held := capMask(data[0].Permitted) | capMask(data[1].Permitted)<<32
	var missing string
	for n := 0; n <= unix.CAP_LAST_CAP; n++ {
		if held&(1<<n) == 0 {
			missing = capNames[n]
			break
		}
	}
	if missing == "" {
		return skipError("this process holds every capability; none to ask for that it lacks")
	}
	rep, err := Apply(Config{ExtraCaps: []string{missing}})
	c.check(err != nil && strings.Contains(err.Error(), missing), "Apply(ExtraCaps: %s) fails naming it: %v", missing, err)
	c.check(!rep.Seccomp && !rep.NoNewPrivs && rep.Caps == nil, "report is empty: %+v", rep)
	checkUnchanged(c)
	return nil
}

// checkUnchanged checks that nothing was applied to this process.
func checkUnchanged(c *checker) {
	st, err := procStatus("/proc/self/status")
	if err != nil {
		c.fail("%v", err)
		return
	}
	c.check(st["Seccomp"] == "0" && st["NoNewPrivs"] == "0", "Seccomp=%s NoNewPrivs=%s: untouched", st["Seccomp"], st["NoNewPrivs"])
	bnd, _ := unix.PrctlRetInt(unix.PR_CAPBSET_READ, unix.CAP_SYS_ADMIN, 0, 0, 0)
	c.check(bnd == 1, "CAP_SYS_ADMIN still in the bounding set")
}
