package int80

// Available reports whether Syscall can issue i386 system calls here.
const Available = true

// Syscall issues i386 system call nr with up to five 32-bit arguments via
// int $0x80 and returns the raw result (-errno on failure).
//
//go:noescape
func Syscall(nr, a1, a2, a3, a4, a5 uint32) int32
