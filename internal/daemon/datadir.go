package daemon

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// journalFault names why the journal could not be written, as a refusal
// reason: by the error's errno, never its text.
func journalFault(err error) string {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return ReasonDataDirFull
	case errors.Is(err, syscall.EROFS):
		return ReasonDataDirReadOnly
	}
	return ReasonJournalUnwritable
}

// lowOnSpace reports whether the data folder has less than
// Config.MinFreeBytes free for an unprivileged writer (statfs). A statfs
// that fails says nothing: the journal write that follows decides.
func (n *Node) lowOnSpace() bool {
	if n.cfg.MinFreeBytes < 0 {
		return false
	}
	var st unix.Statfs_t
	if err := unix.Statfs(n.cfg.DataDir, &st); err != nil {
		return false
	}
	return int64(st.Bavail)*int64(st.Bsize) < n.cfg.MinFreeBytes
}
