package main

// The i386 system call numbers of socket and bind (not socketcall).
const (
	socketNr = 359
	bindNr   = 361
)
