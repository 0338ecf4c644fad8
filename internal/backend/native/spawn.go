package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/agent"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/cgroups"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// initArg is the argument that makes the hutch binary run as a sandbox init.
const initArg = "__hutch_init"

// setupTimeout bounds how long init may take to build the sandbox.
const setupTimeout = 30 * time.Second

// cleanup is a LIFO stack of undo steps for a half-made sandbox.
type cleanup []func()

func (c *cleanup) add(f func()) { *c = append(*c, f) }

func (c *cleanup) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}

// create makes the sandbox's directory and uid range, then starts it. On
// error nothing of it is left.
func (b *Backend) create(ctx context.Context, spec backend.Spec) (_ *sandbox, err error) {
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	root, err := b.resolveBase(ctx, spec.Base)
	if err != nil {
		return nil, err
	}
	for _, l := range spec.Layers {
		if _, err := dirBase(l); err != nil {
			return nil, fmt.Errorf("layer: %w", err)
		}
	}
	st := state{ID: spec.ID, Slot: -1, Size: b.opts.UIDSize, Created: time.Now().UTC(), Spec: spec,
		Root: root, Limits: b.limits(spec.Limits)}
	dir := b.dir(spec.ID)
	if err := makeSandboxDir(dir, len(spec.Layers)+1+len(root.Binds)); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	undo.add(func() { os.RemoveAll(dir) })
	s := &sandbox{b: b, dir: dir, state: st, client: &agent.Client{Socket: filepath.Join(dir, "agent.sock")}}
	p := b.claimParked()
	if p == nil {
		slot, ok := b.slots.take()
		if !ok {
			return nil, fmt.Errorf("all %d uid ranges are in use: %w", b.opts.Slots, errdefs.ErrResourceExhausted)
		}
		s.state.Slot, s.state.UID = slot, b.opts.UIDBase+uint32(slot)*b.opts.UIDSize
		if err := chownUpper(dir, s.state.UID); err != nil {
			b.slots.release(slot)
			return nil, err
		}
	}
	undo.add(func() { b.slots.release(s.state.Slot) })
	if err := b.start(ctx, s, p); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.sandboxes[spec.ID] = s
	b.mu.Unlock()
	return s, nil
}

func (b *Backend) limits(l backend.Limits) backend.Limits {
	d := b.opts.DefaultLimits
	if l.MemoryBytes == 0 {
		l.MemoryBytes = d.MemoryBytes
	}
	if l.Pids == 0 {
		l.Pids = d.Pids
	}
	if l.CPUMillis == 0 {
		l.CPUMillis = d.CPUMillis
	}
	return l
}

// makeSandboxDir lays out a sandbox directory: upper and work for the
// overlay (chowned to the sandbox's root once its range is known), mnt/ with one mount point per layer
// and mnt/root for the assembled root.
func makeSandboxDir(dir string, layers int) error {
	if err := os.Mkdir(dir, 0o711); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("sandbox directory %s: %w", dir, errdefs.ErrAlreadyExists)
		}
		return err
	}
	for _, d := range []string{"upper", "work"} {
		p := filepath.Join(dir, d)
		if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
	}
	dirs := []string{"mnt", "mnt/root"}
	for i := range layers {
		dirs = append(dirs, "mnt/l"+strconv.Itoa(i))
	}
	for _, d := range dirs {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// start runs an init for s over its existing directory: p, a parked one
// from the warm pool, or when p is nil a fresh one on s's uid range.
func (b *Backend) start(ctx context.Context, s *sandbox, p *parked) (err error) {
	st := s.state
	if p != nil {
		s.state.Slot, s.state.UID = p.slot, p.uid
		st = s.state
		if err := chownUpper(s.dir, p.uid); err != nil {
			p.kill()
			return err
		}
	} else if p, err = b.park(st.Slot, filepath.Join(s.dir, "agent.sock")); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			p.kill()
		}
	}()
	if err := p.group.Update(cgroups.Limits(st.Limits)); err != nil {
		return fmt.Errorf("sandbox %s: cgroup limits: %w", st.ID, err)
	}
	if p.sock != filepath.Join(s.dir, "agent.sock") {
		if err := os.Rename(p.sock, filepath.Join(s.dir, "agent.sock")); err != nil {
			return fmt.Errorf("sandbox %s: agent socket: %w", st.ID, err)
		}
	}
	defer p.conn.Close()
	report, err := b.setup(ctx, st, s.dir, p.cmd.Process.Pid, p.conn)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", st.ID, err)
	}
	s.mu.Lock()
	s.state.Pid, s.state.PidStart, s.state.Security, s.state.Cgroup = p.cmd.Process.Pid, p.start, &report, p.group.ID()
	s.group, s.pidfd, s.dead, s.reason, s.lastUse = p.group, p.pidfd, p.dead, "", time.Now()
	s.mu.Unlock()
	if err := s.save(); err != nil {
		return err
	}
	// Only now may init outlive this daemon: a restarted one finds it
	// through the state file. Without the acknowledgement init ends itself.
	if _, err := p.conn.Write([]byte(ackMsg)); err != nil {
		return fmt.Errorf("sandbox %s: acknowledge init: %w", st.ID, err)
	}
	return nil
}

// parked is an init started in its namespaces and cgroup, waiting for its
// configuration. Parking takes most of a sandbox's start-up cost (the
// binary's exec, the namespaces, the cgroup attach) off the create path.
type parked struct {
	cmd   *exec.Cmd
	conn  *os.File // the setup socket
	pidfd int
	dead  chan struct{}
	start uint64
	group *cgroups.Group
	slot  int
	uid   uint32
	sock  string
}

// park starts an init on uid range slot, listening on sock.
func (b *Backend) park(slot int, sock string) (_ *parked, err error) {
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	p := &parked{slot: slot, uid: b.opts.UIDBase + uint32(slot)*b.opts.UIDSize, sock: sock}
	if p.group, err = b.cg.Create(b.cgroupName(slot), cgroups.Limits(b.opts.DefaultLimits)); err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	undo.add(func() { _ = p.group.Delete() })
	ln, err := listenAgent(sock)
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	undo.add(func() { os.Remove(sock) })
	if p.cmd, p.conn, err = b.launch(p.uid, ln); err != nil {
		return nil, err
	}
	undo.add(func() { p.conn.Close() })
	p.dead = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.dead) }()
	undo.add(func() { _ = p.cmd.Process.Kill(); <-p.dead })
	if p.pidfd, err = unix.PidfdOpen(p.cmd.Process.Pid, 0); err != nil {
		return nil, fmt.Errorf("pidfd_open: %w", err)
	}
	undo.add(func() { unix.Close(p.pidfd) })
	if err := p.group.AddProc(p.cmd.Process.Pid); err != nil {
		return nil, fmt.Errorf("join cgroup: %w", err)
	}
	_ = os.WriteFile("/proc/"+strconv.Itoa(p.cmd.Process.Pid)+"/oom_score_adj", []byte("-999"), 0)
	if p.start, err = procStart(p.cmd.Process.Pid); err != nil {
		return nil, fmt.Errorf("init vanished: %w", errdefs.ErrUnavailable)
	}
	if err := awaitParked(p.conn); err != nil {
		return nil, err
	}
	return p, nil
}

// awaitParked waits for init to say it has done all it can before it
// gets its configuration.
func awaitParked(conn *os.File) error {
	_ = conn.SetReadDeadline(time.Now().Add(setupTimeout))
	defer conn.SetReadDeadline(time.Time{})
	buf := make([]byte, 64<<10)
	n, err := conn.Read(buf)
	if err != nil {
		return fmt.Errorf("init did not start: %v: %w", err, errdefs.ErrUnavailable)
	}
	if string(buf[:n]) != parkedMsg {
		return fmt.Errorf("init did not start: %s: %w", buf[:n], errdefs.ErrUnavailable)
	}
	return nil
}

// kill ends a parked (or failed) init and releases its cgroup.
func (p *parked) kill() {
	_ = unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0)
	<-p.dead
	unix.Close(p.pidfd)
	p.conn.Close()
	_ = p.group.Delete()
	_ = os.Remove(p.sock)
}

func (p *parked) alive() bool {
	select {
	case <-p.dead:
		return false
	default:
		return true
	}
}

// cgroupName names a slot's cgroup, prefixed by a tag of the data
// directory so two daemons on one host never share a group.
func (b *Backend) cgroupName(slot int) string {
	return b.tag + "-s" + strconv.Itoa(slot)
}

func chownUpper(dir string, uid uint32) error {
	for _, d := range []string{"upper", "work"} {
		if err := os.Chown(filepath.Join(dir, d), int(uid), int(uid)); err != nil {
			return err
		}
	}
	return nil
}

// listenAgent makes the agent's socket; init inherits the listening fd.
func listenAgent(path string) (*net.UnixListener, error) {
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// launch starts init in its new namespaces. It blocks on its setup socket
// until setup sends it the configuration.
func (b *Backend) launch(uid uint32, ln *net.UnixListener) (*exec.Cmd, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	// The daemon's end is non-blocking, so it sits in the runtime poller
	// and read deadlines bound how long a silent init can stall a create.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, err
	}
	parent, child := os.NewFile(uintptr(fds[0]), "setup"), os.NewFile(uintptr(fds[1]), "setup")
	defer child.Close()
	lnFile, err := ln.File()
	if err != nil {
		parent.Close()
		return nil, nil, err
	}
	defer lnFile.Close()
	cmd := &exec.Cmd{
		Path: b.opts.InitPath,
		Args: []string{"hutch-init", initArg},
		// init reads no cgroup files for GOMAXPROCS: they would be host
		// files open in the sandbox's PID 1.
		Env:        []string{"GODEBUG=containermaxprocs=0,updatemaxprocs=0"},
		Dir:        "/",
		ExtraFiles: []*os.File{lnFile, child},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
				syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(uid), Size: int(b.opts.UIDSize)}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(uid), Size: int(b.opts.UIDSize)}},
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
			Setsid:                     true,
		},
	}
	if err := cmd.Start(); err != nil {
		parent.Close()
		return nil, nil, fmt.Errorf("start init: %v: %w", err, errdefs.ErrUnavailable)
	}
	return cmd, parent, nil
}

// setup prepares the idmapped layers, sends init its configuration and
// waits for init to report the sandbox built.
func (b *Backend) setup(ctx context.Context, st state, dir string, pid int, conn *os.File) (InitReport, error) {
	userns, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/user")
	if err != nil {
		return InitReport{}, fmt.Errorf("init's user namespace: %w", err)
	}
	defer userns.Close()
	cfg, sources := b.initConfig(st, dir)
	var trees []int
	defer func() {
		for _, fd := range trees {
			unix.Close(fd)
		}
	}()
	for _, src := range sources {
		fd, err := idmappedTree(src, int(userns.Fd()))
		if err != nil {
			return InitReport{}, err
		}
		trees = append(trees, fd)
	}
	msg, err := json.Marshal(cfg)
	if err != nil {
		return InitReport{}, err
	}
	if err := sendmsg(conn, msg, unix.UnixRights(trees...)); err != nil {
		return InitReport{}, fmt.Errorf("send init config: %w", err)
	}
	return readReport(ctx, conn)
}

// sendmsg sends one message with ancillary data without taking conn out
// of the poller (File.Fd would make it blocking).
func sendmsg(conn *os.File, msg, oob []byte) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), msg, oob, nil, 0)
		return serr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	return serr
}

func readReport(ctx context.Context, conn *os.File) (InitReport, error) {
	deadline := time.Now().Add(setupTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetReadDeadline(deadline)
	buf := make([]byte, 64<<10)
	n, err := conn.Read(buf)
	if err != nil {
		return InitReport{}, fmt.Errorf("init setup: no answer: %v: %w", err, errdefs.ErrUnavailable)
	}
	var r initReply
	if err := json.Unmarshal(buf[:n], &r); err != nil {
		return InitReport{}, fmt.Errorf("init setup: bad answer: %w", err)
	}
	if r.Error != "" {
		class := errdefs.FromCode(r.Code)
		if class == nil {
			class = errdefs.ErrUnavailable
		}
		return InitReport{}, fmt.Errorf("init setup: %s: %w", r.Error, class)
	}
	return r.Report, nil
}

// idmappedTree clones src as a detached mount tree, read-only and idmapped
// into the user namespace behind usernsFd, so files owned by host root look
// owned by the sandbox's root.
func idmappedTree(src string, usernsFd int) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %v: %w", src, err, classifyMountErr(err))
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(usernsFd)}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("idmapped mount of %s (its filesystem must support idmapped mounts): %v: %w",
			src, err, classifyMountErr(err))
	}
	return fd, nil
}

func classifyMountErr(err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return errdefs.ErrNotFound
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EINVAL), errors.Is(err, unix.EOPNOTSUPP):
		return errdefs.ErrFailedPrecondition
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return errdefs.ErrPermissionDenied
	}
	return errdefs.ErrUnavailable
}

// initConfig builds init's configuration and the list of host trees to
// hand it, in the order of cfg.Trees.
func (b *Backend) initConfig(st state, dir string) (InitConfig, []string) {
	spec := st.Spec
	hostname := spec.Hostname
	if hostname == "" {
		hostname = st.ID
	}
	cfg := InitConfig{
		ID: st.ID, Hostname: hostname, Dir: dir,
		Env: baseEnv(hostname, st.Root.Env, spec.Env), Cwd: orDefault(spec.Cwd, orDefault(st.Root.Cwd, "/workspace")),
		TmpSize: b.opts.TmpSize, Landlock: !b.opts.NoLandlock,
		Nameserver: b.opts.Nameserver, CA: b.opts.CA,
	}
	if len(b.opts.CA) > 0 {
		// Before the image's and the spec's, which may set their own.
		cfg.Env = append(slices.Clone(caEnv), cfg.Env...)
	}
	var sources []string
	// Overlay lower layers, topmost first: template layers, then the base.
	for i := len(spec.Layers) - 1; i >= 0; i-- {
		cfg.Trees = append(cfg.Trees, Tree{Lower: true})
		sources = append(sources, spec.Layers[i])
	}
	cfg.Trees = append(cfg.Trees, Tree{Lower: true})
	sources = append(sources, st.Root.Lower)
	for _, bd := range st.Root.Binds {
		cfg.Trees = append(cfg.Trees, Tree{Target: bd.Target})
		sources = append(sources, bd.Source)
	}
	return cfg, sources
}

// baseEnv is the environment every command starts from: defaults, then the
// image's, then the spec's.
func baseEnv(hostname string, image []string, spec map[string]string) []string {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "USER=root", "LOGNAME=root", "SHELL=/bin/sh", "LANG=C.UTF-8",
		"HOSTNAME=" + hostname,
	}
	env = append(env, image...)
	for k, v := range spec {
		env = append(env, k+"="+v)
	}
	return env
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
