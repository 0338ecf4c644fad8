package server

import "syscall"

// umask sets the process umask and returns the old one, so the socket is
// never, even briefly, open to others.
func umask(m int) int { return syscall.Umask(m) }
