// Command vsockprobe tries to open and bind an AF_VSOCK socket, the way a
// tenant's program would reach the hypervisor around the network
// namespace. The sandbox tests build it for the host's architecture and
// for GOARCH=386 (the 32-bit ABI: on linux/386 the syscall package goes
// through socketcall, and the probe also tries the direct socket call)
// and run it inside a sandbox. It prints "vsock created" and exits 0 when
// any attempt succeeded, and prints each refusal and exits 1 otherwise.
package main

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

const afVsock = 40

// sockaddrVM is struct sockaddr_vm.
type sockaddrVM struct {
	family    uint16
	reserved1 uint16
	port      uint32
	cid       uint32
	zero      [4]byte
}

func main() {
	ok := false
	// Through the syscall package: socket(2) on 64-bit, socketcall(2) on 386.
	if fd, err := syscall.Socket(afVsock, syscall.SOCK_STREAM, 0); err != nil {
		fmt.Println("socket refused:", err)
	} else {
		ok = bindAndReport(fd) || ok
	}
	// The direct socket system call of the running ABI.
	if fd, _, errno := syscall.RawSyscall(socketNr, afVsock, syscall.SOCK_STREAM, 0); errno != 0 {
		fmt.Println("direct socket refused:", errno)
	} else {
		ok = bindAndReport(int(fd)) || ok
	}
	if ok {
		os.Exit(0)
	}
	os.Exit(1)
}

func bindAndReport(fd int) bool {
	sa := sockaddrVM{family: afVsock, port: 0xffffffff, cid: 0xffffffff}
	_, _, errno := syscall.RawSyscall(bindNr, uintptr(fd), uintptr(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
	fmt.Println("vsock created, bind:", errno)
	return true
}
