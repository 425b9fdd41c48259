package hosthelper

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// maxExeBytes bounds how much of a caller's executable is hashed.
const maxExeBytes = 1 << 30

// peer is what the kernel says about a connection's other end.
type peer struct {
	Caller
	pidfd int // -1 when the kernel has no SO_PEERPIDFD
}

// peerOf reads the caller's credentials (SO_PEERCRED: the uid, gid and pid
// at connect time, which the caller cannot forge) and a pidfd for that
// process (SO_PEERPIDFD, Linux 6.5+), which stays bound to the process
// even if its pid is later reused.
func peerOf(c *net.UnixConn) (peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return peer{}, fmt.Errorf("peer credentials: %w", err)
	}
	p := peer{pidfd: -1}
	var uerr error
	cerr := raw.Control(func(fd uintptr) {
		var u *unix.Ucred
		u, uerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if uerr == nil {
			p.Caller = Caller{PID: u.Pid, UID: u.Uid, GID: u.Gid}
		}
		if pfd, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
			p.pidfd = pfd
		}
	})
	if err := errors.Join(cerr, uerr); err != nil {
		if p.pidfd >= 0 {
			unix.Close(p.pidfd)
		}
		return peer{}, fmt.Errorf("peer credentials: %w", err)
	}
	return p, nil
}

// close releases the pidfd.
func (p peer) close() {
	if p.pidfd >= 0 {
		unix.Close(p.pidfd)
	}
}

// exeCheck decides whether an executable is an installed bcd: the helper's
// own executable (same device and inode, or same SHA-256) or one whose
// SHA-256 is pinned in the config.
//
// Residual risk: the executable check is defence in depth, not the
// boundary; the uid/gid check (first, from the kernel) is. A process that
// already runs as the node account can defeat the executable check: it
// can connect, write its request, then execve an installed bcd (the
// socket inherited across the exec) so that /proc/<pid>/exe names bcd
// when the helper looks; or ptrace a running bcd of the same uid. The
// helper narrows this (it checks the executable when the connection is
// accepted, before reading, and again after the request is read, and its
// pidfd check rules out a reused pid) but cannot close it: an attacker with
// the node's uid can do what bcd node can. What the check does stop is a
// different program run as the node account by mistake or by a confused
// deputy (a script, a shell, a tool) talking to the helper directly.
type exeCheck struct {
	self    fileID
	selfF   string // path the helper's own executable is hashed from
	pins    map[[sha256.Size]byte]bool
	once    sync.Once
	selfSum [sha256.Size]byte
	selfErr error
}

func newExeCheck(selfExe string, pins [][sha256.Size]byte) (*exeCheck, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(selfExe, &st); err != nil {
		return nil, fmt.Errorf("helper executable: %w", err)
	}
	e := &exeCheck{self: fileID{dev: st.Dev, ino: st.Ino}, selfF: selfExe, pins: map[[sha256.Size]byte]bool{}}
	for _, p := range pins {
		e.pins[p] = true
	}
	return e, nil
}

// allowed checks the caller's executable: /proc/<pid>/exe is opened (the
// kernel's link to the very file the process runs, even if renamed or
// unlinked), then the pidfd taken at connect time must still name a live
// process, so the opened file belonged to the caller and not to a later
// process that reused its pid. It refuses CodePeerExe.
func (e *exeCheck) allowed(p peer) *helperwire.Refusal {
	no := refuse(helperwire.CodePeerExe, "caller is not an installed bcd")
	if p.PID <= 0 { // a caller in another pid namespace
		return no
	}
	f, err := os.Open("/proc/" + strconv.Itoa(int(p.PID)) + "/exe")
	if err != nil {
		return no
	}
	defer f.Close()
	if p.pidfd >= 0 && unix.PidfdSendSignal(p.pidfd, 0, nil, 0) != nil {
		return no // the caller is gone: the pid may be another process's now
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return no
	}
	if (fileID{dev: st.Dev, ino: st.Ino}) == e.self {
		return nil
	}
	sum, err := hashFile(f)
	if err != nil {
		return no
	}
	if e.pins[sum] {
		return nil
	}
	if self, err := e.selfHash(); err == nil && self == sum {
		return nil
	}
	return no
}

// selfHash is the SHA-256 of the helper's own executable, computed once.
func (e *exeCheck) selfHash() ([sha256.Size]byte, error) {
	e.once.Do(func() {
		f, err := os.Open(e.selfF)
		if err != nil {
			e.selfErr = fmt.Errorf("helper executable: %w", err)
			return
		}
		defer f.Close()
		e.selfSum, e.selfErr = hashFile(f)
	})
	return e.selfSum, e.selfErr
}

func hashFile(f *os.File) ([sha256.Size]byte, error) {
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, maxExeBytes+1))
	if err != nil {
		return [sha256.Size]byte{}, fmt.Errorf("hash executable: %w", err)
	}
	if n > maxExeBytes {
		return [sha256.Size]byte{}, errors.New("hash executable: over 1 GiB")
	}
	return [sha256.Size]byte(h.Sum(nil)), nil
}
