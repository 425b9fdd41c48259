// Command inotifyhog opens inotify instances, the kernel budget the
// kernel counts per user (fs.inotify.max_user_instances, 128 by default).
// "inotifyhog N" opens up to N and prints "opened K" and the first error;
// with a second argument "hold" it then keeps them open until killed.
package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

func main() {
	n, _ := strconv.Atoi(os.Args[1])
	opened := 0
	for range n {
		if _, err := syscall.InotifyInit1(0); err != nil {
			fmt.Println("inotify_init1:", err)
			break
		}
		opened++
	}
	fmt.Println("opened", opened)
	if len(os.Args) > 2 && os.Args[2] == "hold" {
		for {
			time.Sleep(time.Hour)
		}
	}
}
