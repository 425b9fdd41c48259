package hosthelper

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
)

// Errors Listen refuses a socket directory with; each names the rule broken.
var (
	// ErrDirNotDir: the socket's directory is missing, a symlink or not a
	// directory.
	ErrDirNotDir = errors.New("socket directory must be a real directory, not a symlink")
	// ErrDirOwner: the socket's directory is not owned by root (uid 0).
	ErrDirOwner = errors.New("socket directory must be owned by root (uid 0)")
	// ErrDirWritable: the socket's directory is writable by group or other.
	ErrDirWritable = errors.New("socket directory must not be writable by group or other")
)

// Listen binds the helper's Unix socket at path, mode 0660, owned by
// uid:gid (root and the node account's group). The socket's directory must
// be root's and closed to group and other writes, else Listen refuses with
// ErrDirNotDir, ErrDirOwner or ErrDirWritable. The socket is bound,
// chmodded and chowned inside a fresh private 0700 directory made in the
// socket's directory and only then renamed into place, so root never
// chmods or chowns through a name another account could have planted (a
// symlink at path is replaced, its target untouched). Closing the listener
// removes the socket if it is still the one bound.
func Listen(path string, uid, gid int) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := checkSocketDir(dir); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(dir, ".bind-")
	if err != nil {
		return nil, fmt.Errorf("helper socket: private directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("helper socket: private directory: %w", err)
	}
	bound := filepath.Join(tmp, "s")
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: bound, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("helper socket: bind: %w", err)
	}
	ul.SetUnlinkOnClose(false)
	id, err := placeSocket(bound, path, uid, gid)
	if err != nil {
		ul.Close()
		return nil, err
	}
	return &listener{UnixListener: ul, path: path, id: id}, nil
}

// checkSocketDir enforces the socket directory's rules without following a
// symlink at dir itself.
func checkSocketDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrDirNotDir, dir, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() {
		return fmt.Errorf("%w: %s", ErrDirNotDir, dir)
	}
	if st.Uid != 0 {
		return fmt.Errorf("%w: %s is owned by uid %d", ErrDirOwner, dir, st.Uid)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: %s has mode %v", ErrDirWritable, dir, fi.Mode().Perm())
	}
	return nil
}

// placeSocket sets the bound socket's mode and owner inside the private
// directory (no one else can reach that name) and renames it to path. It
// returns the socket's identity, so Close removes only this socket.
func placeSocket(bound, path string, uid, gid int) (fileID, error) {
	if err := os.Chmod(bound, 0o660); err != nil {
		return fileID{}, fmt.Errorf("helper socket: chmod: %w", err)
	}
	if err := os.Lchown(bound, uid, gid); err != nil {
		return fileID{}, fmt.Errorf("helper socket: chown: %w", err)
	}
	id, err := lstatID(bound)
	if err != nil {
		return fileID{}, err
	}
	if err := os.Rename(bound, path); err != nil {
		return fileID{}, fmt.Errorf("helper socket: rename into place: %w", err)
	}
	return id, nil
}

// fileID is a file's identity: its device and inode.
type fileID struct{ dev, ino uint64 }

func lstatID(path string) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return fileID{}, fmt.Errorf("helper socket: stat: %w", err)
	}
	return fileID{dev: st.Dev, ino: st.Ino}, nil
}

// listener removes its socket on Close when the name still holds it.
type listener struct {
	*net.UnixListener
	path string
	id   fileID
}

// Close stops accepting and removes the socket if path is still ours.
func (l *listener) Close() error {
	err := l.UnixListener.Close()
	if id, serr := lstatID(l.path); serr == nil && id == l.id {
		_ = os.Remove(l.path)
	}
	return err
}
