//go:build linux

package terminal

import (
	"os"
	"syscall"
)

// rootCmdAttr is a root command's process attributes: its own process
// group and, when this process is root, its own PID namespace. In the
// namespace the command is process 1: when it ends or is killed the
// kernel kills every process left in the namespace, so nothing it
// started (with setsid, a double fork or a new process group) outlives
// it, a revoke or the grant's end.
func rootCmdAttr() *syscall.SysProcAttr {
	a := groupAttr()
	if os.Geteuid() == 0 {
		a.Cloneflags = syscall.CLONE_NEWPID
	}
	return a
}
