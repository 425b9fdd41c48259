package plugin

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// deniedSyscalls answer EPERM inside a plugin: kexec, kernel modules,
// mounts and the new mount API, namespaces, swap, reboot, bpf, io_uring,
// ptrace and cross-process memory, the keyring, perf, userfaultfd,
// open_by_handle_at, clock changes, acct, quotactl, lookup_dcookie and
// syslog. None is needed by a driver that talks to bcd over its pipes, and
// each is a kernel surface a compromised plugin would use to escape.
var deniedSyscalls = []string{
	"kexec_load", "kexec_file_load",
	"init_module", "finit_module", "delete_module",
	"mount", "umount2", "pivot_root", "move_mount", "open_tree", "open_tree_attr",
	"fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr",
	"unshare", "setns",
	"swapon", "swapoff", "reboot", "bpf",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"ptrace", "process_vm_readv", "process_vm_writev",
	"keyctl", "add_key", "request_key",
	"perf_event_open", "userfaultfd", "open_by_handle_at",
	"settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
	"acct", "quotactl", "lookup_dcookie", "syslog",
}

// x86Only are denied too where the architecture has them (raw I/O ports).
var x86Only = []string{"ioperm", "iopl"}

// cloneNewFlags are every CLONE_NEW* flag clone(2) takes; a clone with any
// of them set is refused, a clone without (threads, fork) is allowed, or
// the plugin's own runtime could not start.
const cloneNewFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// Policy returns the seccomp policy for plugins on this architecture:
// allow by default, EPERM for deniedSyscalls and for clone with a
// CLONE_NEW* flag, ENOSYS for clone3 (whose flags sit in memory a filter
// cannot read, so callers fall back to clone).
func Policy() seccomp.Policy {
	names := append([]string(nil), deniedSyscalls...)
	if runtime.GOARCH == "amd64" || runtime.GOARCH == "386" {
		names = append(names, x86Only...)
	}
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: names},
			{Action: seccomp.ActionErrno, NamesWithCondtions: []seccomp.NameWithConditions{{
				Name:       "clone",
				Conditions: seccomp.ArgumentConditions{{Argument: cloneFlagsArg, Operation: seccomp.BitsSet, Value: cloneNewFlags}},
			}}},
			{Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS), Names: []string{"clone3"}},
		},
	}
}

// Program assembles the filter: the library's policy program behind a
// guard of our own that kills the process on a call from a foreign ABI (an
// audit arch other than this build's, or x32's numbering on amd64). The
// library alone sends a foreign arch to the default action, which is
// allow, and answers x32 with ENOSYS; a blacklist must not be bypassable
// through the other ABI, so both are killed here first.
func Program() ([]bpf.RawInstruction, error) {
	pol := Policy()
	body, err := pol.Assemble()
	if err != nil {
		return nil, fmt.Errorf("assemble policy: %w", err)
	}
	kill := bpf.RetConstant{Val: uint32(seccomp.ActionKillProcess)}
	guard := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: nativeAuditArch, SkipTrue: 1},
		kill,
	}
	if runtime.GOARCH == "amd64" {
		guard = append(guard,
			bpf.LoadAbsolute{Off: 0, Size: 4}, // seccomp_data.nr
			bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: x32SyscallBit, SkipFalse: 1},
			kill,
		)
	}
	raw, err := bpf.Assemble(append(guard, body...))
	if err != nil {
		return nil, fmt.Errorf("assemble filter: %w", err)
	}
	return raw, nil
}

const x32SyscallBit = 0x40000000

// InstallFilter sets no_new_privs and installs Program on every thread of
// the calling process (SECCOMP_FILTER_FLAG_TSYNC). It locks the calling
// goroutine to its thread, since no_new_privs is set per thread and TSYNC
// spreads it from the thread that installs the filter.
func InstallFilter() error {
	raw, err := Program()
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	filt := make([]unix.SockFilter, len(raw))
	for i, in := range raw {
		filt[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	prog := unix.SockFprog{Len: uint16(len(filt)), Filter: &filt[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(filt)
	if errno != 0 {
		return fmt.Errorf("seccomp: %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("seccomp: thread %d could not be synchronised: %w", r, errors.New("tsync"))
	}
	return nil
}
