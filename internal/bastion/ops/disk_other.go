//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package ops

import "errors"

// statDisk is not available on this system.
func statDisk(string) (Filesystem, error) {
	return Filesystem{}, errors.New("ops: statfs is not available on this system")
}
