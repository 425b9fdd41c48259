package devenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrDataDirInUse is returned by Start when another dev holds the data
// folder's lock.
var ErrDataDirInUse = errors.New("data folder in use")

// lockFile is the lock of a data folder, relative to it.
const lockFile = ".lock"

// lockDataDir makes the data folder (0700) and takes an exclusive,
// non-blocking flock on DIR/.lock, held until the returned function runs
// (or the process ends, when the kernel drops it). A second dev on the
// same folder would otherwise rewrite DIR/env with its own port and share
// the SQLite database and node journals with the first.
func lockDataDir(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: another better-compute dev is running with --data %s (it holds %s); stop it, or start this one with another --data",
				ErrDataDirInUse, dir, path)
		}
		return nil, fmt.Errorf("data dir lock %s: %w", path, err)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}
