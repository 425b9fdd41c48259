package plugin

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// ShimCommand is the hidden bcd subcommand that becomes a plugin: bcd
// starts itself as `bcd __bcx-exec ARGV0 ARGS...` with the pinned plugin
// binary open on fd 3 and a gate pipe on fd 4.
const ShimCommand = "__bcx-exec"

// The descriptors the shim inherits.
const (
	shimBinaryFD = 3
	shimGateFD   = 4
)

// ShimMain is the shim. It waits for one byte on fd 4, which bcd writes
// only after it has put the shim into the plugin's cgroups, so no plugin
// code ever runs outside them; then it marks fds 3 and 4 close-on-exec,
// sets no_new_privs, installs the seccomp filter on every thread and
// executes the binary open on fd 3 through /proc/self/fd/3, with argv
// and env. It returns only on failure.
func ShimMain(argv, env []string) error {
	if len(argv) == 0 {
		return refuse(CodeShim, errors.New("no argv"))
	}
	// The parent-death signal bcd set (Pdeathsig) is a property of the
	// thread it forked, this process's first; the Go runtime may run this
	// goroutine on another thread, and an exec from another thread drops
	// the first one with its setting (the plugin would outlive bcd). This
	// goroutine keeps one thread from here to the exec, sets the signal on
	// it again, and checks bcd is still its parent after that.
	runtime.LockOSThread()
	bcd := os.Getppid()
	gate := os.NewFile(shimGateFD, "gate")
	var b [1]byte
	if n, err := gate.Read(b[:]); n != 1 {
		return refuse(CodeShim, fmt.Errorf("gate not opened: %w", err))
	}
	gate.Close()
	// The exec below opens the binary through the magic link before the
	// kernel closes close-on-exec descriptors, so an ELF plugin runs and
	// keeps no descriptor to its own file (a script plugin would not run).
	if _, err := unix.FcntlInt(shimBinaryFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return refuse(CodeShim, fmt.Errorf("cloexec: %w", err))
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return refuse(CodeShim, fmt.Errorf("parent-death signal: %w", err))
	}
	if os.Getppid() != bcd {
		return refuse(CodeShim, errors.New("bcd exited before the plugin started"))
	}
	if err := InstallFilter(); err != nil {
		return refuse(CodeShim, err)
	}
	err := unix.Exec(fmt.Sprintf("/proc/self/fd/%d", shimBinaryFD), argv, env)
	return refuse(CodeShim, fmt.Errorf("exec: %w", err))
}
