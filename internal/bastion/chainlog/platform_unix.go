//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package chainlog

import (
	"fmt"
	"os"
	"syscall"
)

// openFlags refuses to follow a symlink at the last path element.
const openFlags = syscall.O_NOFOLLOW | syscall.O_CLOEXEC

// checkModeBits: Unix modes are real, so group/other bits are refused.
const checkModeBits = true

// lockFile takes an exclusive advisory lock on f without waiting, so two
// Logs (two bastions) never extend the same chain.
func lockFile(f *os.File) error {
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("chainlog: lock: %w", err)
	}
	return nil
}
