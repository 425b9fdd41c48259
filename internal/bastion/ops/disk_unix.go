//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package ops

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// statDisk reads path's filesystem size and the bytes free to an
// unprivileged user.
func statDisk(path string) (Filesystem, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Filesystem{}, fmt.Errorf("ops: statfs: %w", err)
	}
	bs := uint64(st.Bsize)
	return Filesystem{Path: path, TotalBytes: uint64(st.Blocks) * bs, FreeBytes: uint64(st.Bavail) * bs}, nil
}
