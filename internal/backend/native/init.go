package native

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/agent"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/harden"
)

// InitConfig is what the host sends init to build the sandbox.
type InitConfig struct {
	ID       string   `json:"id"`
	Hostname string   `json:"hostname"`
	Dir      string   `json:"dir"` // the sandbox directory on the host
	Trees    []Tree   `json:"trees"`
	Env      []string `json:"env"`
	Cwd      string   `json:"cwd"`
	TmpSize  int64    `json:"tmp_size"`
	Landlock bool     `json:"landlock"`
	// Nameserver goes into /etc/resolv.conf; empty: the file is left as
	// the base has it.
	Nameserver string `json:"nameserver,omitempty"`
	// CA is a PEM certificate the sandbox trusts besides the base's: it
	// is written to /etc/hutch/ca.pem and, with the base's bundle, to
	// /etc/hutch/ca-bundle.crt.
	CA []byte `json:"ca,omitempty"`
}

// Tree says where one received mount tree goes: into the overlay's lower
// layers (in order, topmost first) or bind-mounted at Target in the root.
type Tree struct {
	Lower  bool   `json:"lower,omitempty"`
	Target string `json:"target,omitempty"`
}

// InitReport is what init reports of the confinement it applied.
type InitReport struct {
	Seccomp     bool     `json:"seccomp"`
	NoNewPrivs  bool     `json:"no_new_privs"`
	Caps        []string `json:"caps"`
	LandlockABI int      `json:"landlock_abi"`
}

type initReply struct {
	Error  string     `json:"error,omitempty"`
	Code   string     `json:"code,omitempty"`
	Report InitReport `json:"report"`
}

// parkedMsg is what init sends once it is ready for its configuration;
// ackMsg is what the daemon sends once it has recorded init's report.
const (
	parkedMsg = "parked"
	ackMsg    = "recorded"
)

// Fds init inherits: the agent's listening socket and the setup socket.
const (
	listenFd = 3
	setupFd  = 4
)

// IsInit reports whether this process was started as a sandbox init.
func IsInit() bool { return len(os.Args) > 1 && os.Args[1] == initArg }

// InitMain runs a sandbox's init: it builds the sandbox from the host's
// configuration, confines itself, reports back, and then serves as the
// agent until the sandbox dies. It never returns.
func InitMain() {
	closeInheritedFds()
	setup := os.NewFile(setupFd, "setup")
	// The slow half of hardening runs before the configuration arrives,
	// while this init may still be parked in the warm pool.
	prep, err := harden.Prepare(harden.Config{})
	_, _ = setup.Write([]byte(parkedMsg)) // ready to be claimed
	var cfg InitConfig
	var trees []int
	if err == nil {
		cfg, trees, err = readConfig(setup)
	} else {
		_, _, _ = readConfig(setup)
	}
	var report InitReport
	if err == nil {
		report, err = buildSandbox(cfg, trees, prep)
	}
	reply := initReply{Report: report}
	if err != nil {
		reply.Error, reply.Code = err.Error(), errdefs.Code(err)
	}
	raw, _ := json.Marshal(reply)
	_, _ = setup.Write(raw)
	if err != nil {
		setup.Close()
		os.Exit(1)
	}
	// Commands must not inherit the setup socket while it stays open.
	unix.CloseOnExec(setupFd)
	go awaitAck(setup)
	// Signals from inside the sandbox must not end init; Notify (unlike
	// Ignore) leaves commands with default dispositions after exec.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE)
	go func() {
		for range sigs {
		}
	}()
	lnFile := os.NewFile(listenFd, "agent")
	ln, err := net.FileListener(lnFile)
	if err != nil {
		os.Exit(2)
	}
	lnFile.Close() // the listener holds a close-on-exec duplicate
	srv := agent.New(agent.Config{Env: cfg.Env, Cwd: cfg.Cwd, ResetOOMScore: true, ReapAll: true})
	_ = srv.Serve(ln)
	os.Exit(3)
}

// closeInheritedFds closes every descriptor init inherited beyond its two
// own: whatever the daemon's parent left open without close-on-exec would
// otherwise reach every command in the sandbox (runc CVE-2024-21626). The
// Go runtime's own descriptors are all close-on-exec, which tells them apart.
func closeInheritedFds() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		_ = unix.CloseRange(setupFd+1, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
		return
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= setupFd {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.Close(fd)
		}
	}
}

// awaitAck waits for the daemon to say it has recorded this init (its pid
// is in the sandbox's state file, where a restarted daemon finds it). A
// daemon that dies before that leaves a sandbox nobody can find or stop,
// so init ends it.
func awaitAck(setup *os.File) {
	buf := make([]byte, 64)
	n, err := setup.Read(buf)
	if err != nil || string(buf[:n]) != ackMsg {
		os.Exit(4)
	}
	setup.Close()
}

func readConfig(setup *os.File) (InitConfig, []int, error) {
	var cfg InitConfig
	buf := make([]byte, 256<<10)
	oob := make([]byte, unix.CmsgSpace(64*4))
	n, oobn, _, _, err := unix.Recvmsg(int(setup.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return cfg, nil, fmt.Errorf("read config: %w", err)
	}
	if err := json.Unmarshal(buf[:n], &cfg); err != nil {
		return cfg, nil, fmt.Errorf("decode config: %w", err)
	}
	var fds []int
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return cfg, nil, err
	}
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			return cfg, nil, err
		}
		fds = append(fds, got...)
	}
	if len(fds) != len(cfg.Trees) {
		return cfg, nil, fmt.Errorf("got %d mount trees for %d layers", len(fds), len(cfg.Trees))
	}
	return cfg, fds, nil
}

// buildSandbox assembles the root filesystem, pivots into it and confines
// init. Everything it mounts lives in the sandbox's own mount namespace.
func buildSandbox(cfg InitConfig, trees []int, prep *harden.Prepared) (InitReport, error) {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return InitReport{}, fmt.Errorf("make / private: %w", err)
	}
	root := filepath.Join(cfg.Dir, "mnt", "root")
	if err := mountRoot(cfg, trees, root); err != nil {
		return InitReport{}, err
	}
	if err := populateRoot(cfg, root); err != nil {
		return InitReport{}, err
	}
	if err := pivot(root); err != nil {
		return InitReport{}, err
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return InitReport{}, fmt.Errorf("sethostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return InitReport{}, err
	}
	if err := nullStdio(); err != nil {
		return InitReport{}, err
	}
	rep, err := prep.Apply(cfg.Landlock)
	if err != nil {
		return InitReport{}, fmt.Errorf("confine: %w", err)
	}
	// Not dumpable: processes in the sandbox cannot ptrace init or open
	// its /proc entries (its fds, its exe).
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return InitReport{}, fmt.Errorf("prctl dumpable: %w", err)
	}
	return InitReport{Seccomp: rep.Seccomp, NoNewPrivs: rep.NoNewPrivs, Caps: rep.Caps, LandlockABI: rep.LandlockABI}, nil
}

// mountRoot attaches the received layer trees and mounts the overlay root.
func mountRoot(cfg InitConfig, trees []int, root string) error {
	var lowers []string
	var binds []int
	for i, t := range cfg.Trees {
		if !t.Lower {
			binds = append(binds, i)
			continue
		}
		target := filepath.Join(cfg.Dir, "mnt", "l"+strconv.Itoa(i))
		if err := unix.MoveMount(trees[i], "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attach layer %d: %w", i, err)
		}
		lowers = append(lowers, target)
	}
	opts := "lowerdir=" + joinColon(lowers) + ",upperdir=" + filepath.Join(cfg.Dir, "upper") +
		",workdir=" + filepath.Join(cfg.Dir, "work") + ",userxattr"
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay root: %v: %w", err, errdefs.ErrFailedPrecondition)
	}
	for _, i := range binds {
		target := filepath.Join(root, cfg.Trees[i].Target)
		if err := unix.MoveMount(trees[i], "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("mount %s: %w", cfg.Trees[i].Target, err)
		}
	}
	for _, fd := range trees {
		unix.Close(fd)
	}
	return nil
}

func joinColon(ss []string) string {
	out := ""
	for i, s := range ss {
		if i > 0 {
			out += ":"
		}
		out += s
	}
	return out
}

// devices are bind-mounted from the host's /dev; nothing else is there.
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// populateRoot mounts /proc, /sys, /dev, /tmp and makes /workspace and the
// per-sandbox files of /etc.
func populateRoot(cfg InitConfig, root string) error {
	const nsd = unix.MS_NOSUID | unix.MS_NODEV
	steps := []struct {
		src, target, fstype string
		flags               uintptr
		data                string
		optional            bool
	}{
		{"proc", "proc", "proc", nsd | unix.MS_NOEXEC, "", false},
		{"sysfs", "sys", "sysfs", nsd | unix.MS_NOEXEC | unix.MS_RDONLY, "", true},
		{"tmpfs", "dev", "tmpfs", unix.MS_NOSUID | unix.MS_NOEXEC, "mode=755,size=65536", false},
		{"tmpfs", "tmp", "tmpfs", nsd, "mode=1777,size=" + strconv.FormatInt(cfg.TmpSize, 10), false},
	}
	for _, st := range steps {
		target := filepath.Join(root, st.target)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("mkdir /%s: %w", st.target, err)
		}
		if err := unix.Mount(st.src, target, st.fstype, st.flags, st.data); err != nil && !st.optional {
			return fmt.Errorf("mount /%s: %w", st.target, err)
		}
	}
	if err := populateDev(filepath.Join(root, "dev")); err != nil {
		return err
	}
	for _, d := range []string{"workspace", cfg.Cwd} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", d, err)
		}
	}
	if err := writeEtc(root, cfg.Hostname); err != nil {
		return err
	}
	return writeNetEtc(root, cfg)
}

func populateDev(dev string) error {
	for _, d := range devices {
		target := filepath.Join(dev, d)
		if err := os.WriteFile(target, nil, 0o666); err != nil {
			return err
		}
		if err := unix.Mount("/dev/"+d, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", d, err)
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC,
		"newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	if err := unix.Mount("shm", filepath.Join(dev, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size=67108864"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	links := map[string]string{"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2", "core": "/proc/kcore"}
	delete(links, "core")
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	return nil
}

func writeEtc(root, hostname string) error {
	etc := filepath.Join(root, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"hostname": hostname + "\n",
		"hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" +
			hostname + "\n",
	}
	for name, content := range files {
		p := filepath.Join(etc, name)
		_ = os.Remove(p) // it may be a symlink in an image
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return fmt.Errorf("write /etc/%s: %w", name, err)
		}
	}
	return nil
}

// pivot makes root the root of this mount namespace and drops the old one.
func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return unix.Chdir("/")
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// nullStdio points init's stdin, stdout and stderr at the sandbox's
// /dev/null, dropping the host files it was started with.
func nullStdio() error {
	fd, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/null: %w", err)
	}
	defer unix.Close(fd)
	for i := 0; i < 3; i++ {
		if err := unix.Dup3(fd, i, 0); err != nil {
			return fmt.Errorf("dup stdio: %w", err)
		}
	}
	return nil
}

// caBundles are where bases keep their system trust bundle.
var caBundles = []string{"etc/ssl/certs/ca-certificates.crt", "etc/pki/tls/certs/ca-bundle.crt", "etc/ssl/cert.pem"}

// writeNetEtc writes the resolver and the daemon's CA into the root.
func writeNetEtc(root string, cfg InitConfig) error {
	if cfg.Nameserver != "" {
		p := filepath.Join(root, "etc", "resolv.conf")
		_ = os.Remove(p) // it may be a symlink in an image
		if err := os.WriteFile(p, []byte("nameserver "+cfg.Nameserver+"\noptions ndots:0\n"), 0o644); err != nil {
			return fmt.Errorf("write /etc/resolv.conf: %w", err)
		}
	}
	if len(cfg.CA) == 0 {
		return nil
	}
	dir := filepath.Join(root, "etc", "hutch")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), cfg.CA, 0o644); err != nil {
		return fmt.Errorf("write /etc/hutch/ca.pem: %w", err)
	}
	var bundle []byte
	for _, b := range caBundles {
		if data, err := os.ReadFile(filepath.Join(root, b)); err == nil {
			bundle = append(data, '\n')
			break
		}
	}
	bundle = append(bundle, cfg.CA...)
	if err := os.WriteFile(filepath.Join(dir, "ca-bundle.crt"), bundle, 0o644); err != nil {
		return fmt.Errorf("write /etc/hutch/ca-bundle.crt: %w", err)
	}
	return nil
}

// caEnv points the common TLS clients at the bundle with hutch's CA.
var caEnv = []string{
	"SSL_CERT_FILE=/etc/hutch/ca-bundle.crt", "REQUESTS_CA_BUNDLE=/etc/hutch/ca-bundle.crt",
	"CURL_CA_BUNDLE=/etc/hutch/ca-bundle.crt", "GIT_SSL_CAINFO=/etc/hutch/ca-bundle.crt",
	"PIP_CERT=/etc/hutch/ca-bundle.crt", "NODE_EXTRA_CA_CERTS=/etc/hutch/ca.pem",
}
