//go:build !amd64

package int80

// Available reports whether Syscall can issue i386 system calls here.
const Available = false

// Syscall is not available on this architecture; it returns -ENOSYS.
func Syscall(nr, a1, a2, a3, a4, a5 uint32) int32 { return -38 }
