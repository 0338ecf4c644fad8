package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/agent"
	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/cgroups"
)

// state is what the backend persists of a sandbox, in its directory and in
// the Handle it gives the caller.
type state struct {
	ID       string         `json:"id"`
	Slot     int            `json:"slot"`
	UID      uint32         `json:"uid"`
	Size     uint32         `json:"size"`
	Created  time.Time      `json:"created"`
	Spec     backend.Spec   `json:"spec"`
	Root     rootfs         `json:"root"`
	Limits   backend.Limits `json:"limits"`
	Cgroup   string         `json:"cgroup,omitempty"`
	Pid      int            `json:"pid,omitempty"`
	PidStart uint64         `json:"pid_start,omitempty"` // /proc/PID/stat starttime
	Security *InitReport    `json:"security,omitempty"`
}

// sandbox is the backend's live record of one sandbox.
type sandbox struct {
	b      *Backend
	dir    string
	client *agent.Client

	mu      sync.Mutex
	state   state
	group   *cgroups.Group
	pidfd   int
	dead    chan struct{} // closed when init is gone
	reason  string
	paused  bool
	lastUse time.Time
}

func (s *sandbox) handle() backend.Handle {
	s.mu.Lock()
	defer s.mu.Unlock()
	raw, _ := json.Marshal(s.state)
	return backend.Handle{ID: s.state.ID, Backend: Name, Version: stateVersion, State: raw}
}

func (s *sandbox) alive() bool {
	s.mu.Lock()
	dead := s.dead
	s.mu.Unlock()
	if dead == nil {
		return false
	}
	select {
	case <-dead:
		return false
	default:
		return true
	}
}

func (s *sandbox) touch() {
	s.mu.Lock()
	s.lastUse = time.Now()
	s.mu.Unlock()
}

func (s *sandbox) info() backend.Info {
	s.mu.Lock()
	st, reason, dead, group, paused := s.state, s.reason, s.dead, s.group, s.paused
	s.mu.Unlock()
	info := backend.Info{ID: st.ID, Created: st.Created, Status: backend.StatusStopped, Cgroup: st.Cgroup}
	if dead == nil {
		return info
	}
	select {
	case <-dead:
		info.Status, info.Reason = backend.StatusDead, reason
		if reason == "" {
			info.Reason = "init exited"
		}
		return info
	default:
	}
	info.Status, info.Pid, info.Processes = backend.StatusRunning, st.Pid, -1
	if paused {
		info.Status = backend.StatusPaused
	}
	if group != nil {
		if pids, err := group.Pids(); err == nil {
			info.Processes = max(len(pids)-1, 0)
		}
	}
	return info
}

// save writes the state file atomically.
func (s *sandbox) save() error {
	s.mu.Lock()
	raw, err := json.MarshalIndent(s.state, "", "  ")
	s.mu.Unlock()
	if err != nil {
		return err
	}
	tmp := filepath.Join(s.dir, "state.json.tmp")
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(s.dir, "state.json"))
}

// stop kills init (and with it the whole pid namespace), waits until it is
// gone, and deletes the sandbox's cgroup. It is idempotent.
func (s *sandbox) stop(ctx context.Context) error {
	s.mu.Lock()
	dead, pidfd, group := s.dead, s.pidfd, s.group
	s.mu.Unlock()
	if dead != nil && pidfd > 0 {
		_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
	}
	if group != nil {
		// A frozen process cannot die: thaw after the kill is queued, so
		// nothing runs another instruction of its own.
		_ = group.Thaw()
	}
	if dead != nil {
		select {
		case <-dead:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("sandbox %s: init did not die within 10s", s.state.ID)
		}
	}
	if group == nil && s.state.Cgroup != "" {
		if g, err := s.b.cg.Load(s.state.Cgroup); err == nil {
			group = g
		}
	}
	if group != nil {
		if err := group.Delete(); err != nil {
			return fmt.Errorf("sandbox %s: cgroup: %w", s.state.ID, err)
		}
	}
	s.mu.Lock()
	if s.pidfd > 0 {
		unix.Close(s.pidfd)
		s.pidfd = 0
	}
	s.group = nil
	s.dead = nil
	s.paused = false
	s.state.Pid, s.state.PidStart = 0, 0
	s.mu.Unlock()
	if _, err := os.Stat(s.dir); err == nil {
		_ = os.Remove(filepath.Join(s.dir, frozenMark)) // nothing is left to thaw
		return s.save()
	}
	return nil
}

// watch closes dead when the process behind pidfd exits.
func watch(pidfd int, dead chan struct{}) {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, -1)
		if n > 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
			close(dead)
			return
		}
	}
}

// adopt takes over a sandbox found in a handle or on disk: if its init
// still runs (same pid and start time), it is watched again and its agent
// is reachable; otherwise it is recorded as dead.
func (b *Backend) adopt(st state) *sandbox {
	s := &sandbox{b: b, dir: b.dir(st.ID), state: st,
		client: &agent.Client{Socket: filepath.Join(b.dir(st.ID), "agent.sock")}}
	b.slots.claim(st.Slot)
	if st.Pid > 0 {
		s.dead = make(chan struct{})
		if start, err := procStart(st.Pid); err == nil && start == st.PidStart {
			if fd, err := unix.PidfdOpen(st.Pid, 0); err == nil {
				s.pidfd = fd
				go watch(fd, s.dead)
			} else {
				close(s.dead)
			}
		} else {
			s.reason = "init was gone when the daemon recovered the sandbox"
			close(s.dead)
		}
		if g, err := b.cg.Load(st.Cgroup); err == nil {
			s.group = g
		}
	}
	s.thawLeftFreeze()
	b.mu.Lock()
	b.sandboxes[st.ID] = s
	b.mu.Unlock()
	return s
}

func (b *Backend) loadFromDisk(id string) *sandbox {
	raw, err := os.ReadFile(filepath.Join(b.dir(id), "state.json"))
	if err != nil {
		if _, serr := os.Stat(b.dir(id)); serr == nil {
			// A directory without state: a create that crashed early.
			return &sandbox{b: b, dir: b.dir(id), state: state{ID: id, Slot: -1}}
		}
		return nil
	}
	var st state
	if json.Unmarshal(raw, &st) != nil || st.ID != id {
		return &sandbox{b: b, dir: b.dir(id), state: state{ID: id, Slot: -1}}
	}
	return b.adopt(st)
}

// claimSlotsOnDisk marks the uid ranges of sandboxes on disk as taken, so
// a new sandbox never shares a range with one the daemon has not recovered.
func (b *Backend) claimSlotsOnDisk() {
	entries, _ := os.ReadDir(filepath.Join(b.opts.DataDir, "sandboxes"))
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(b.opts.DataDir, "sandboxes", e.Name(), "state.json"))
		if err != nil {
			continue
		}
		var st state
		if json.Unmarshal(raw, &st) == nil {
			b.slots.claim(st.Slot)
		}
	}
}

// procStart reads a process's start time (clock ticks since boot), which
// with the pid identifies it across pid reuse.
func procStart(pid int) (uint64, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	// starttime is field 22; fields[0] here is field 3.
	return strconv.ParseUint(fields[19], 10, 64)
}

// slotSet hands out uid range slots.
type slotSet struct {
	mu   sync.Mutex
	used []bool
	next int
}

func newSlotSet(n int) *slotSet { return &slotSet{used: make([]bool, n)} }

func (s *slotSet) take() (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.used {
		k := (s.next + i) % len(s.used)
		if !s.used[k] {
			s.used[k] = true
			s.next = k + 1
			return k, true
		}
	}
	return 0, false
}

func (s *slotSet) taken(k int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return k >= 0 && k < len(s.used) && s.used[k]
}

func (s *slotSet) claim(k int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k >= 0 && k < len(s.used) {
		s.used[k] = true
	}
}

func (s *slotSet) release(k int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k >= 0 && k < len(s.used) {
		s.used[k] = false
	}
}

// sweepCgroups deletes the empty cgroups of slots no sandbox on disk holds:
// a daemon killed with inits parked, or before it recorded a new sandbox,
// leaves them (those inits end themselves, the groups stay).
func (b *Backend) sweepCgroups() {
	for slot := range b.opts.Slots {
		if b.slots.taken(slot) {
			continue
		}
		g, err := b.cg.Load(b.cgroupName(slot))
		if err != nil {
			continue
		}
		if pids, err := g.Pids(); err == nil && len(pids) == 0 {
			_ = g.Delete()
		}
	}
}
