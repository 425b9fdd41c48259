package plugin

import (
	"encoding/binary"
	"testing"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompData lays out struct seccomp_data for x/net/bpf's VM, which loads
// words big-endian: each 32-bit field, and each half of a 64-bit argument
// at the offset the kernel's native (little-endian) layout gives it.
func seccompData(nr, auditArch uint32, arg0 uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[0:], nr)
	binary.BigEndian.PutUint32(b[4:], auditArch)
	binary.BigEndian.PutUint32(b[16:], uint32(arg0))     // low word first on little-endian
	binary.BigEndian.PutUint32(b[20:], uint32(arg0>>32)) // then the high word
	return b
}

// TestProgramVerdicts runs the assembled filter on syscalls: every denied
// name answers EPERM, clone with any CLONE_NEW* flag EPERM and without
// ALLOW, clone3 ENOSYS, an ordinary call ALLOW, and a call from a foreign
// ABI (i386's audit arch, x32's numbering) kills the process.
func TestProgramVerdicts(t *testing.T) {
	info, err := arch.GetInfo("")
	if err != nil {
		t.Skip(err)
	}
	raw, err := Program()
	if err != nil {
		t.Fatal(err)
	}
	insts, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("disassemble")
	}
	vm, err := bpf.NewVM(insts)
	if err != nil {
		t.Fatal(err)
	}
	verdict := func(nr, a uint32, arg0 uint64) uint32 {
		v, err := vm.Run(seccompData(nr, a, arg0))
		if err != nil {
			t.Fatal(err)
		}
		return uint32(v)
	}
	native := uint32(nativeAuditArch)
	eperm := uint32(seccomp.ActionErrno) | uint32(unix.EPERM)
	// The list the brief and docs/security.md name, spelled here rather
	// than taken from deniedSyscalls, so dropping one there fails here.
	names := []string{"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
		"mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "fspick",
		"unshare", "setns", "swapon", "swapoff", "reboot", "bpf", "io_uring_setup", "io_uring_enter", "io_uring_register",
		"ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key", "perf_event_open",
		"userfaultfd", "open_by_handle_at", "ioperm", "iopl", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
		"acct", "quotactl", "lookup_dcookie", "syslog"}
	for _, n := range names {
		nr, ok := info.SyscallNames[n]
		if !ok {
			continue // not on this architecture
		}
		if got := verdict(uint32(nr), native, 0); got != eperm {
			t.Errorf("%s: %#x, want EPERM", n, got)
		}
	}
	clone := uint32(info.SyscallNames["clone"])
	for _, f := range []uint64{unix.CLONE_NEWNS, unix.CLONE_NEWUSER, unix.CLONE_NEWNET, unix.CLONE_NEWPID, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC, unix.CLONE_NEWCGROUP} {
		if got := verdict(clone, native, f|uint64(unix.SIGCHLD)); got != eperm {
			t.Errorf("clone %#x: %#x, want EPERM", f, got)
		}
	}
	threads := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_SYSVSEM | unix.CLONE_THREAD)
	for _, f := range []uint64{threads, uint64(unix.SIGCHLD)} {
		if got := verdict(clone, native, f); got != uint32(seccomp.ActionAllow) {
			t.Errorf("clone %#x: %#x, want ALLOW", f, got)
		}
	}
	if got := verdict(uint32(info.SyscallNames["clone3"]), native, 0); got != uint32(seccomp.ActionErrno)|uint32(unix.ENOSYS) {
		t.Errorf("clone3: %#x, want ENOSYS", got)
	}
	if got := verdict(uint32(info.SyscallNames["read"]), native, 0); got != uint32(seccomp.ActionAllow) {
		t.Errorf("read: %#x, want ALLOW", got)
	}
	kill := uint32(seccomp.ActionKillProcess)
	if got := verdict(uint32(info.SyscallNames["read"]), unix.AUDIT_ARCH_I386, 0); got != kill {
		t.Errorf("foreign arch: %#x, want KILL_PROCESS", got)
	}
	if info.ID == arch.X86_64.ID {
		if got := verdict(x32SyscallBit|uint32(info.SyscallNames["read"]), native, 0); got != kill {
			t.Errorf("x32 call: %#x, want KILL_PROCESS", got)
		}
	}
}
