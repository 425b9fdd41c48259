package sandbox

import (
	"encoding/binary"
	"runtime"
)

// initProgram returns a tiny static ELF program for PID 1 inside a
// sandbox, or nil when there is none for this architecture (the sandbox
// then runs the image's sleep as PID 1, which does not reap orphans).
//
// Why hand-assembled: PID 1 of a PID namespace must reap the orphans of
// every exec, or their zombies keep counting against the pids limit; the
// image cannot be trusted to bring an init, bcd's own binary is usually
// dynamically linked, and no Debian package ships a static reaper. The
// program is 64 bytes of x86-64 and does only this, forever:
//
//	loop:  wait4(-1, NULL, __WALL, NULL)   ; reap any child
//	       if rax >= 0: goto loop
//	       nanosleep({1, 0}, NULL)         ; no children yet: wait a second
//	       goto loop
//
// It ignores every signal (PID 1 without handlers), so only SIGKILL from
// the host ends it.
func initProgram() []byte {
	if runtime.GOARCH != "amd64" {
		return nil
	}
	code := []byte{
		0xbf, 0xff, 0xff, 0xff, 0xff, // 00 mov edi, -1
		0x31, 0xf6, // 05 xor esi, esi
		0xba, 0x00, 0x00, 0x00, 0x40, // 07 mov edx, 0x40000000 (__WALL)
		0x45, 0x31, 0xd2, // 0c xor r10d, r10d
		0xb8, 0x3d, 0x00, 0x00, 0x00, // 0f mov eax, 61 (wait4)
		0x0f, 0x05, // 14 syscall
		0x48, 0x85, 0xc0, // 16 test rax, rax
		0x79, 0xe5, // 19 jns 00
		0x48, 0x8d, 0x3d, 0x0e, 0x00, 0x00, 0x00, // 1b lea rdi, [rip+0x0e] (30)
		0x31, 0xf6, // 22 xor esi, esi
		0xb8, 0x23, 0x00, 0x00, 0x00, // 24 mov eax, 35 (nanosleep)
		0x0f, 0x05, // 29 syscall
		0xeb, 0xd3, // 2b jmp 00
		0x90, 0x90, 0x90, // 2d padding
		1, 0, 0, 0, 0, 0, 0, 0, // 30 tv_sec = 1
		0, 0, 0, 0, 0, 0, 0, 0, // 38 tv_nsec = 0
	}
	return staticELF(code)
}

// usernsProgram returns a tiny static ELF program that makes a user
// namespace owned by the id it runs as, and a network namespace owned by
// that user namespace (an egress sandbox's link goes there), or nil when
// there is none for this architecture. bcd starts it as the sandbox's host root id, writes
// the namespace's id maps, and hands the namespace to runc: the
// namespace's owner, the id the kernel charges its per-user budgets to
// in the host's namespace (inotify instances and watches, and the rest
// counted per user namespace), is then the sandbox's own, not root's as
// when runc makes the namespace. It does, in x86-64:
//
//	unshare(CLONE_NEWUSER|CLONE_NEWNET); if it fails: exit(1)
//	write(1, "\0", 1)       ; tell bcd the namespace exists
//	loop: pause(); goto loop ; until bcd kills it
func usernsProgram() []byte {
	if runtime.GOARCH != "amd64" {
		return nil
	}
	code := []byte{
		0xbf, 0x00, 0x00, 0x00, 0x50, // 00 mov edi, 0x50000000 (CLONE_NEWUSER|CLONE_NEWNET)
		0xb8, 0x10, 0x01, 0x00, 0x00, // 05 mov eax, 272 (unshare)
		0x0f, 0x05, // 0a syscall
		0x85, 0xc0, // 0c test eax, eax
		0x75, 0x1e, // 0e jnz 2e
		0x50,             // 10 push rax (a zero byte)
		0x48, 0x89, 0xe6, // 11 mov rsi, rsp
		0xba, 0x01, 0x00, 0x00, 0x00, // 14 mov edx, 1
		0xbf, 0x01, 0x00, 0x00, 0x00, // 19 mov edi, 1
		0xb8, 0x01, 0x00, 0x00, 0x00, // 1e mov eax, 1 (write)
		0x0f, 0x05, // 23 syscall
		0xb8, 0x22, 0x00, 0x00, 0x00, // 25 mov eax, 34 (pause)
		0x0f, 0x05, // 2a syscall
		0xeb, 0xf7, // 2c jmp 25
		0xbf, 0x01, 0x00, 0x00, 0x00, // 2e mov edi, 1
		0xb8, 0x3c, 0x00, 0x00, 0x00, // 33 mov eax, 60 (exit)
		0x0f, 0x05, // 38 syscall
	}
	return staticELF(code)
}

// Limits every process of a user-namespaced sandbox inherits (see
// rlimitExecProgram).
const (
	sandboxNoFile = 1024
	sandboxCore   = 0
)

// rlimitExecProgram returns a tiny static ELF program that sets
// RLIMIT_NOFILE to 1024 (soft and hard) and RLIMIT_CORE to 0, then
// executes its arguments (argv[1] with argv[1:], the same environment),
// or nil when there is none for this architecture. bcd runs runc through
// it for sandboxes in their own user namespace: runc sets a process's
// limits from the host with prlimit, which the kernel refuses for a
// process in a namespace root does not own unless root holds
// CAP_SYS_RESOURCE; lowered before runc starts, the limits are inherited
// by everything runc starts instead, and lowering needs no capability.
// In x86-64:
//
//	setrlimit(RLIMIT_NOFILE, {1024, 1024})
//	setrlimit(RLIMIT_CORE, {0, 0})
//	execve(argv[1], &argv[1], envp); exit(127)
func rlimitExecProgram() []byte {
	if runtime.GOARCH != "amd64" {
		return nil
	}
	code := []byte{
		0xbf, 0x07, 0x00, 0x00, 0x00, // 00 mov edi, 7 (RLIMIT_NOFILE)
		0x48, 0x8d, 0x35, 0x44, 0x00, 0x00, 0x00, // 05 lea rsi, [rip+0x44] (50)
		0xb8, 0xa0, 0x00, 0x00, 0x00, // 0c mov eax, 160 (setrlimit)
		0x0f, 0x05, // 11 syscall
		0xbf, 0x04, 0x00, 0x00, 0x00, // 13 mov edi, 4 (RLIMIT_CORE)
		0x48, 0x8d, 0x35, 0x41, 0x00, 0x00, 0x00, // 18 lea rsi, [rip+0x41] (60)
		0xb8, 0xa0, 0x00, 0x00, 0x00, // 1f mov eax, 160 (setrlimit)
		0x0f, 0x05, // 24 syscall
		0x48, 0x8b, 0x0c, 0x24, // 26 mov rcx, [rsp] (argc)
		0x48, 0x8d, 0x74, 0x24, 0x10, // 2a lea rsi, [rsp+16] (&argv[1])
		0x48, 0x8b, 0x3e, // 2f mov rdi, [rsi] (argv[1])
		0x48, 0x8d, 0x54, 0xcc, 0x10, // 32 lea rdx, [rsp+rcx*8+16] (envp)
		0xb8, 0x3b, 0x00, 0x00, 0x00, // 37 mov eax, 59 (execve)
		0x0f, 0x05, // 3c syscall
		0xbf, 0x7f, 0x00, 0x00, 0x00, // 3e mov edi, 127
		0xb8, 0x3c, 0x00, 0x00, 0x00, // 43 mov eax, 60 (exit)
		0x0f, 0x05, // 48 syscall
		0x90, 0x90, 0x90, 0x90, 0x90, 0x90, // 4a padding
	}
	le := binary.LittleEndian
	code = le.AppendUint64(code, sandboxNoFile) // 50 RLIMIT_NOFILE soft
	code = le.AppendUint64(code, sandboxNoFile) // 58 hard
	code = le.AppendUint64(code, sandboxCore)   // 60 RLIMIT_CORE soft
	code = le.AppendUint64(code, sandboxCore)   // 68 hard
	return staticELF(code)
}

// staticELF wraps x86-64 code in a minimal static ELF executable loaded
// at 0x400000, entry at the code's start.
func staticELF(code []byte) []byte {
	const base, hdr = 0x400000, 64 + 56
	total := uint64(hdr + len(code))
	b := make([]byte, 0, total)
	le := binary.LittleEndian
	b = append(b, 0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0) // ELF64, little endian, SysV
	b = le.AppendUint16(b, 2)                                              // ET_EXEC
	b = le.AppendUint16(b, 0x3e)                                           // EM_X86_64
	b = le.AppendUint32(b, 1)                                              // EV_CURRENT
	b = le.AppendUint64(b, base+hdr)                                       // entry
	b = le.AppendUint64(b, 64)                                             // program headers at 64
	b = le.AppendUint64(b, 0)                                              // no section headers
	b = le.AppendUint32(b, 0)                                              // flags
	b = le.AppendUint16(b, 64)                                             // header size
	b = le.AppendUint16(b, 56)                                             // program header size
	b = le.AppendUint16(b, 1)                                              // one program header
	b = le.AppendUint16(b, 64)                                             // section header size
	b = le.AppendUint16(b, 0)
	b = le.AppendUint16(b, 0)
	// PT_LOAD, read + execute, the whole file at base.
	b = le.AppendUint32(b, 1)
	b = le.AppendUint32(b, 5)
	b = le.AppendUint64(b, 0)
	b = le.AppendUint64(b, base)
	b = le.AppendUint64(b, base)
	b = le.AppendUint64(b, total)
	b = le.AppendUint64(b, total)
	b = le.AppendUint64(b, 0x1000)
	return append(b, code...)
}
