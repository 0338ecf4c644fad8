package hutch

import (
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/hutch-dev/hutch/api"
)

// State is a sandbox's lifecycle state.
type State string

// The sandbox states.
const (
	StateCreating  State = "creating"
	StateRunning   State = "running"
	StatePaused    State = "paused"
	StateSuspended State = "suspended"
	StateRetired   State = "retired"
	StateDestroyed State = "destroyed"
	StateFailed    State = "failed"
)

// Limits are a sandbox's resource limits; zero means the daemon's default.
type Limits struct {
	MemoryMiB int64 `json:"memory_mb,omitempty"`  // memory in MiB
	CPUMillis int64 `json:"cpu_millis,omitempty"` // CPU time per second, 1000 = one core
	Pids      int64 `json:"pids,omitempty"`       // processes
}

// ExitStatus says how a command ended.
type ExitStatus struct {
	// ExitCode is nil when the command was killed by a signal.
	ExitCode *int   `json:"exit_code"`
	Signal   string `json:"signal,omitempty"` // e.g. "SIGKILL"
	TimedOut bool   `json:"timed_out"`
	Killed   bool   `json:"killed"`         // killed by hutch (timeout, cancel, limit)
	Lost     int64  `json:"lost,omitempty"` // output bytes no longer retained
}

// Code is the status as a shell reports it: the exit code, 124 after a
// timeout, 128+N after signal N.
func (s ExitStatus) Code() int {
	switch {
	case s.TimedOut:
		return 124
	case s.ExitCode != nil:
		return *s.ExitCode
	case s.Signal != "":
		return 128 + SignalNumber(s.Signal)
	}
	return 1
}

// Success reports a zero exit code.
func (s ExitStatus) Success() bool { return s.ExitCode != nil && *s.ExitCode == 0 && !s.TimedOut }

func fromAPIExit(code *int, signal string, timedOut, killed bool, lost int64) ExitStatus {
	return ExitStatus{ExitCode: code, Signal: signal, TimedOut: timedOut, Killed: killed, Lost: lost}
}

// Process is a process in a sandbox's process table.
type Process struct {
	ID        string      `json:"id"`
	PID       int         `json:"pid"`
	Cmd       string      `json:"cmd"`
	Tag       string      `json:"tag,omitempty"`
	TTY       bool        `json:"tty,omitempty"`
	StartedAt time.Time   `json:"started_at"`
	Running   bool        `json:"running"`
	Exit      *ExitStatus `json:"exit,omitempty"` // set once it has ended
	NextSeq   int64       `json:"next_seq"`       // the sequence number of its next output chunk
}

func fromAPIProcess(p api.Process) *Process {
	out := &Process{ID: p.Id, PID: p.Pid, Cmd: p.Cmd, Tag: p.Tag, TTY: p.Tty, StartedAt: p.StartedAt,
		Running: p.Running, NextSeq: p.NextSeq}
	if x := p.Exit; x != nil {
		st := fromAPIExit(x.ExitCode, x.Signal, x.TimedOut, x.Killed, x.Lost)
		out.Exit = &st
	}
	return out
}

// FileInfo describes a file in a sandbox.
type FileInfo struct {
	Name       string      `json:"name"`
	Path       string      `json:"path"`
	Size       int64       `json:"size"`
	Mode       fs.FileMode `json:"mode"` // permission bits and type, as in package os
	Type       string      `json:"type"` // file, dir, symlink or other
	LinkTarget string      `json:"link_target,omitempty"`
	UID        int         `json:"uid"`
	GID        int         `json:"gid"`
	ModTime    time.Time   `json:"modified_at"`
}

// IsDir reports whether f is a directory.
func (f *FileInfo) IsDir() bool { return f.Mode.IsDir() }

func fromAPIFile(f api.FileInfo) *FileInfo {
	n, _ := strconv.ParseUint(f.Mode, 8, 32)
	mode := fs.FileMode(n & 0o777)
	for bit, m := range map[uint64]fs.FileMode{0o4000: fs.ModeSetuid, 0o2000: fs.ModeSetgid, 0o1000: fs.ModeSticky} {
		if n&bit != 0 {
			mode |= m
		}
	}
	switch {
	case f.IsDir || f.Type == api.Dir:
		mode |= fs.ModeDir
	case f.Type == api.Symlink:
		mode |= fs.ModeSymlink
	case f.Type == api.Other:
		mode |= fs.ModeIrregular
	}
	return &FileInfo{Name: f.Name, Path: f.Path, Size: f.Size, Mode: mode, Type: string(f.Type),
		LinkTarget: f.LinkTarget, UID: f.Uid, GID: f.Gid, ModTime: f.ModifiedAt}
}

// modeString is the wire form of permission bits: "0644", "4755".
func modeString(m fs.FileMode) string {
	n := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		n |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		n |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		n |= 0o1000
	}
	return "0" + strconv.FormatUint(uint64(n), 8)
}

// Key is an API key (never its secret).
type Key struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	Tenant     string     `json:"tenant"`
	Prefix     string     `json:"prefix"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
}

func fromAPIKey(k api.Key) *Key {
	return &Key{ID: k.Id, Name: k.Name, Tenant: k.Tenant, Prefix: k.Prefix, CreatedAt: k.CreatedAt,
		LastUsedAt: k.LastUsedAt, RevokedAt: k.RevokedAt, ExpiresAt: k.ExpiresAt}
}

// CreatedKey is a new key with its secret, which is shown only once.
type CreatedKey struct {
	Key    Key    `json:"key"`
	Secret string `json:"secret"`
}

// signals are Linux's signal numbers (the sandbox's, whatever the client's
// OS), for ExitStatus.Code.
var signals = map[string]int{
	"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6, "SIGBUS": 7,
	"SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12, "SIGPIPE": 13,
	"SIGALRM": 14, "SIGTERM": 15, "SIGSTKFLT": 16, "SIGCHLD": 17, "SIGCONT": 18, "SIGSTOP": 19,
	"SIGTSTP": 20, "SIGTTIN": 21, "SIGTTOU": 22, "SIGURG": 23, "SIGXCPU": 24, "SIGXFSZ": 25,
	"SIGVTALRM": 26, "SIGPROF": 27, "SIGWINCH": 28, "SIGIO": 29, "SIGPWR": 30, "SIGSYS": 31,
}

// SignalNumber returns the Linux number of a signal name ("SIGTERM" or
// "TERM"), or 0 when it is unknown.
func SignalNumber(name string) int {
	if n, err := strconv.Atoi(name); err == nil {
		return n
	}
	name = strings.ToUpper(name)
	if n, ok := signals[name]; ok {
		return n
	}
	return signals["SIG"+name]
}
