//go:build !unix

package terminal

import "syscall"

// killSession does nothing where there are no sessions: pty.StartWithSize
// refuses to start a shell there, so there is nothing to kill.
func killSession(int) {}

// groupAttr is no attribute: there are no process groups to make.
func groupAttr() *syscall.SysProcAttr { return nil }

// killGroup does nothing: RunRoot kills the process itself there.
func killGroup(int) {}
