package harden

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// capNames maps every capability this package knows to its name.
var capNames = map[int]string{
	unix.CAP_CHOWN:              "CAP_CHOWN",
	unix.CAP_DAC_OVERRIDE:       "CAP_DAC_OVERRIDE",
	unix.CAP_DAC_READ_SEARCH:    "CAP_DAC_READ_SEARCH",
	unix.CAP_FOWNER:             "CAP_FOWNER",
	unix.CAP_FSETID:             "CAP_FSETID",
	unix.CAP_KILL:               "CAP_KILL",
	unix.CAP_SETGID:             "CAP_SETGID",
	unix.CAP_SETUID:             "CAP_SETUID",
	unix.CAP_SETPCAP:            "CAP_SETPCAP",
	unix.CAP_LINUX_IMMUTABLE:    "CAP_LINUX_IMMUTABLE",
	unix.CAP_NET_BIND_SERVICE:   "CAP_NET_BIND_SERVICE",
	unix.CAP_NET_BROADCAST:      "CAP_NET_BROADCAST",
	unix.CAP_NET_ADMIN:          "CAP_NET_ADMIN",
	unix.CAP_NET_RAW:            "CAP_NET_RAW",
	unix.CAP_IPC_LOCK:           "CAP_IPC_LOCK",
	unix.CAP_IPC_OWNER:          "CAP_IPC_OWNER",
	unix.CAP_SYS_MODULE:         "CAP_SYS_MODULE",
	unix.CAP_SYS_RAWIO:          "CAP_SYS_RAWIO",
	unix.CAP_SYS_CHROOT:         "CAP_SYS_CHROOT",
	unix.CAP_SYS_PTRACE:         "CAP_SYS_PTRACE",
	unix.CAP_SYS_PACCT:          "CAP_SYS_PACCT",
	unix.CAP_SYS_ADMIN:          "CAP_SYS_ADMIN",
	unix.CAP_SYS_BOOT:           "CAP_SYS_BOOT",
	unix.CAP_SYS_NICE:           "CAP_SYS_NICE",
	unix.CAP_SYS_RESOURCE:       "CAP_SYS_RESOURCE",
	unix.CAP_SYS_TIME:           "CAP_SYS_TIME",
	unix.CAP_SYS_TTY_CONFIG:     "CAP_SYS_TTY_CONFIG",
	unix.CAP_MKNOD:              "CAP_MKNOD",
	unix.CAP_LEASE:              "CAP_LEASE",
	unix.CAP_AUDIT_WRITE:        "CAP_AUDIT_WRITE",
	unix.CAP_AUDIT_CONTROL:      "CAP_AUDIT_CONTROL",
	unix.CAP_SETFCAP:            "CAP_SETFCAP",
	unix.CAP_MAC_OVERRIDE:       "CAP_MAC_OVERRIDE",
	unix.CAP_MAC_ADMIN:          "CAP_MAC_ADMIN",
	unix.CAP_SYSLOG:             "CAP_SYSLOG",
	unix.CAP_WAKE_ALARM:         "CAP_WAKE_ALARM",
	unix.CAP_BLOCK_SUSPEND:      "CAP_BLOCK_SUSPEND",
	unix.CAP_AUDIT_READ:         "CAP_AUDIT_READ",
	unix.CAP_PERFMON:            "CAP_PERFMON",
	unix.CAP_BPF:                "CAP_BPF",
	unix.CAP_CHECKPOINT_RESTORE: "CAP_CHECKPOINT_RESTORE",
}

// capNumbers is the inverse of capNames.
var capNumbers = func() map[string]int {
	m := make(map[string]int, len(capNames))
	for n, s := range capNames {
		m[s] = n
	}
	return m
}()

// DefaultCaps returns the capabilities a sandbox keeps by default: the
// minimal set container runtimes (Docker, containerd) grant.
func DefaultCaps() []string {
	return []string{
		"CAP_CHOWN",
		"CAP_DAC_OVERRIDE",
		"CAP_FSETID",
		"CAP_FOWNER",
		"CAP_MKNOD",
		"CAP_NET_RAW",
		"CAP_SETGID",
		"CAP_SETUID",
		"CAP_SETFCAP",
		"CAP_SETPCAP",
		"CAP_NET_BIND_SERVICE",
		"CAP_SYS_CHROOT",
		"CAP_KILL",
		"CAP_AUDIT_WRITE",
	}
}

// capMask is a set of capabilities, bit n = capability n.
type capMask uint64

// capSet returns DefaultCaps plus extra, or an error naming every unknown
// capability in extra.
func capSet(extra []string) (capMask, error) {
	var m capMask
	for _, name := range DefaultCaps() {
		m |= 1 << capNumbers[name]
	}
	var unknown []string
	for _, name := range extra {
		n, ok := parseCap(name)
		if !ok {
			unknown = append(unknown, fmt.Sprintf("%q", name))
			continue
		}
		m |= 1 << n
	}
	if len(unknown) > 0 {
		return 0, fmt.Errorf("harden: unknown capability %s", strings.Join(unknown, ", "))
	}
	return m, nil
}

// parseCap accepts "CAP_SYS_PTRACE", "cap_sys_ptrace" and "SYS_PTRACE".
func parseCap(name string) (int, bool) {
	s := strings.ToUpper(strings.TrimSpace(name))
	if !strings.HasPrefix(s, "CAP_") {
		s = "CAP_" + s
	}
	n, ok := capNumbers[s]
	return n, ok
}

// names lists the capabilities in m in capability-number order.
func (m capMask) names() []string {
	var out []string
	for v := uint64(m); v != 0; v &= v - 1 {
		n := bits.TrailingZeros64(v)
		if s, ok := capNames[n]; ok {
			out = append(out, s)
		} else {
			out = append(out, fmt.Sprintf("CAP_%d", n))
		}
	}
	return out
}

// checkHeld returns an error when set asks for capabilities the process does
// not have in its permitted set: capset could not grant them, and finding out
// there would leave the process half-hardened.
func checkHeld(set capMask) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("harden: capget: %w", err)
	}
	held := capMask(data[0].Permitted) | capMask(data[1].Permitted)<<32
	if missing := set &^ held; missing != 0 {
		return fmt.Errorf("harden: capabilities not held by this process: %s",
			strings.Join(missing.names(), ", "))
	}
	return nil
}

// lastCap returns the highest capability number the running kernel knows.
// It probes with PR_CAPBSET_READ instead of reading
// /proc/sys/kernel/cap_last_cap so it works without /proc.
func lastCap() (int, error) {
	last := -1
	for c := 0; c < 64; c++ {
		if _, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				break
			}
			return 0, fmt.Errorf("prctl(PR_CAPBSET_READ, %d): %w", c, err)
		}
		last = c
	}
	if last < 0 {
		return 0, errors.New("prctl(PR_CAPBSET_READ) knows no capability")
	}
	return last, nil
}

// dropBounding drops every capability outside set from the bounding set, on
// all threads. It leaves the effective set alone, so the caller can still
// mount and pivot: only what an exec can gain is limited.
func dropBounding(set capMask) error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	if over := set >> (last + 1); over != 0 {
		return fmt.Errorf("%v not supported by this kernel (last capability is %d)",
			(over << (last + 1)).names(), last)
	}
	// PR_CAPBSET_DROP needs CAP_SETPCAP in the effective set, which is
	// still there. Each drop stops the world once, which is why a parked
	// init does this before it is claimed.
	for c := 0; c <= last; c++ {
		if set&(1<<c) != 0 {
			continue
		}
		if err := allThreads(fmt.Sprintf("prctl(PR_CAPBSET_DROP, %d)", c), syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return err
		}
	}
	return nil
}

// applyCaps sets the permitted, effective and inheritable sets to set and
// clears the ambient set, on all threads. The bounding set must already be
// dropped to set.
func applyCaps(set capMask) error {
	hdr := &unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := &[2]unix.CapUserData{}
	for i := range data {
		w := uint32(set >> (32 * i))
		data[i] = unix.CapUserData{Effective: w, Permitted: w, Inheritable: w}
	}
	if err := allThreads("capset", syscall.SYS_CAPSET,
		uintptr(unsafe.Pointer(hdr)), uintptr(unsafe.Pointer(data)), 0, 0, 0); err != nil {
		return err
	}

	// Lowering permitted/inheritable already removes ambient capabilities
	// outside set; clear the rest too. EINVAL: kernel without ambient
	// capabilities (< 4.3), nothing to clear.
	if err := allThreads("prctl(PR_CAP_AMBIENT_CLEAR_ALL)", syscall.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return nil
}
