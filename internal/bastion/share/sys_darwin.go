package share

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// openFlags opens a resolved path for reading: O_NOFOLLOW refuses a link
// put at its end since it was resolved, O_NONBLOCK keeps a FIFO put there
// from blocking the open.
const openFlags = os.O_RDONLY | syscall.O_NOFOLLOW | syscall.O_NONBLOCK

// renameNoReplace renames from (in fromDir) to to (in toDir), failing
// with errExists if to exists: renameatx_np with RENAME_EXCL, so the
// kernel never replaces a name, whatever appeared since the checks.
func renameNoReplace(fromDir *os.File, from string, toDir *os.File, to string) error {
	err := unix.RenameatxNp(int(fromDir.Fd()), from, int(toDir.Fd()), to, unix.RENAME_EXCL)
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		return errExists
	}
	return err
}
