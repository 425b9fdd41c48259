package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Host uid/gid blocks of runc sandboxes. Each runc sandbox runs in its own
// user namespace whose ids 0..size-1 map to a block of host ids of its
// own, cut from a range reserved for bcd: no two sandboxes, and no
// sandbox and a host user, share a host uid, so the kernel's per-user
// budgets (inotify instances and watches, message queues, pipe pages,
// RLIMIT_NPROC) are each sandbox's own.
const (
	// DefaultIDBase is the first host id of the reserved range; it must
	// be above every id the machine uses for anything else.
	DefaultIDBase = 1 << 30
	// DefaultIDSize is the size of each sandbox's block (the ids a
	// sandbox can name, 65534 "nobody" among them).
	DefaultIDSize = 65536
)

// IDRange is a sandbox's block of host ids: id n in the sandbox is host
// id Base+n, for n below Size. The zero value means no user namespace
// (runsc, whose processes are the Sentry's own and not host processes,
// and the sim runtime).
type IDRange struct {
	Base uint32 `json:"base"`
	Size uint32 `json:"size"`
}

// Valid reports whether r is a block (not the zero value).
func (r IDRange) Valid() bool { return r.Size > 0 }

// Host returns the host id of id n in the sandbox.
func (r IDRange) Host(n uint32) int { return int(r.Base + n) }

// checkIDRange checks a configured reserved range of blocks blocks.
func checkIDRange(base, size uint32, blocks int) error {
	switch {
	case size < 65536:
		return fmt.Errorf("sandbox: id block size %d: at least 65536", size)
	case base < 65536*2:
		return fmt.Errorf("sandbox: id base %d: the reserved range must lie above the machine's own ids", base)
	case uint64(base)+uint64(size)*uint64(blocks) > 1<<32-2:
		return fmt.Errorf("sandbox: id range %d + %d x %d passes the largest id", base, blocks, size)
	}
	return nil
}

// allocIDRange returns the first block of the range free of used (the
// bases of the blocks the host's sandboxes hold).
func allocIDRange(base, size uint32, blocks int, used map[uint32]bool) (IDRange, error) {
	for i := range blocks {
		b := base + uint32(i)*size
		if !used[b] {
			return IDRange{Base: b, Size: size}, nil
		}
	}
	return IDRange{}, errors.New("sandbox: id range exhausted")
}

// UserNS is a user namespace made for one sandbox, owned by the
// sandbox's host root id and mapping its block, with a network namespace
// it owns; both live while the helper process does, or anything inside
// them.
type UserNS struct {
	cmd  *exec.Cmd
	PID  int    // the helper's pid (ip netns attach takes it)
	Path string // /proc/PID/ns/user, for runc to join
}

// newUserNS starts program (usernsProgram written to a file) as r's host
// root id, waits for it to have made its user namespace, and writes the
// namespace's uid and gid maps (ids 0..r.Size-1 to r.Base onwards).
func newUserNS(program string, r IDRange) (*UserNS, error) {
	cmd := exec.Command(program)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: r.Base, Gid: r.Base, Groups: []uint32{}},
		Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("sandbox: user namespace: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("sandbox: user namespace: %w", err)
	}
	ns := &UserNS{cmd: cmd, PID: cmd.Process.Pid, Path: filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "ns", "user")}
	var b [1]byte
	if _, err := io.ReadFull(out, b[:]); err != nil {
		ns.Close()
		return nil, fmt.Errorf("sandbox: user namespace not made: %w", err)
	}
	line := fmt.Appendf(nil, "0 %d %d\n", r.Base, r.Size)
	for _, m := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), m), line, 0); err != nil {
			ns.Close()
			return nil, fmt.Errorf("sandbox: user namespace %s: %w", m, err)
		}
	}
	return ns, nil
}

// Close ends the helper; the namespace lives on in what joined it.
func (n *UserNS) Close() {
	_ = n.cmd.Process.Kill()
	_ = n.cmd.Wait()
}

// idmappedMount mounts a clone of src at dst, read-only, with its ids
// shifted through the user namespace at nsPath (host id n shows as the
// host id that the namespace's id n maps to): the image's root-owned
// files are then owned by the sandbox's own root, as the kernel sees it,
// without copying or chowning the image that other sandboxes share.
func idmappedMount(src, dst, nsPath string) error {
	ns, err := os.Open(nsPath)
	if err != nil {
		return fmt.Errorf("sandbox: id map namespace: %w", err)
	}
	defer ns.Close()
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("sandbox: id map clone: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(ns.Fd())}); err != nil {
		return fmt.Errorf("sandbox: id map: %w", err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("sandbox: id map mount: %w", err)
	}
	return nil
}
