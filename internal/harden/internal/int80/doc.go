// Package int80 makes i386 system calls from a 64-bit process with
// "int $0x80", for tests that check the seccomp filter also covers the 32-bit
// compat ABI (a 64-bit process can use it to reach syscalls a native-only
// filter never sees).
package int80
