package main

import "syscall"

// The arm64 system call numbers of socket and bind.
const (
	socketNr = syscall.SYS_SOCKET
	bindNr   = syscall.SYS_BIND
)
