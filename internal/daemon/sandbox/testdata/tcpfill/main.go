// Command tcpfill queues data on loopback TCP connections that nobody
// reads, the way a sandbox would hold kernel memory outside its memory
// limit. It opens up to 200 connected pairs on 127.0.0.1 and writes to
// both ends of each, non-blocking, until the kernel takes no more (or
// 512 MiB are queued in all), then prints "queued N" (bytes) and exits.
package main

import (
	"fmt"
	"os"
	"syscall"
)

const (
	pairs    = 200
	maxTotal = 512 << 20
)

func main() {
	ln, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	check(err)
	check(syscall.Bind(ln, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	check(syscall.Listen(ln, 1024))
	sa, err := syscall.Getsockname(ln)
	check(err)
	buf := make([]byte, 1<<20)
	var total int64
	for i := 0; i < pairs && total < maxTotal; i++ {
		c, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
		if err != nil {
			fmt.Println("socket:", err)
			break
		}
		if err := syscall.Connect(c, sa); err != nil {
			fmt.Println("connect:", err)
			break
		}
		s, _, err := syscall.Accept(ln)
		if err != nil {
			fmt.Println("accept:", err)
			break
		}
		for _, fd := range []int{c, s} {
			check(syscall.SetNonblock(fd, true))
			for total < maxTotal {
				n, err := syscall.Write(fd, buf)
				if n > 0 {
					total += int64(n)
				}
				if err != nil || n <= 0 {
					break
				}
			}
		}
	}
	fmt.Printf("queued %d\n", total)
}

func check(err error) {
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
}
