//go:build !linux

package terminal

import "syscall"

// rootCmdAttr is a root command's process attributes: its own process
// group only (no PID namespaces here; a process that leaves the group
// outlives a revoke).
func rootCmdAttr() *syscall.SysProcAttr { return groupAttr() }
