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
