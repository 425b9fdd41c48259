package plugin

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// OpenPinned opens the plugin binary at path without following a symlink
// (O_NOFOLLOW, close-on-exec), checks that it is a regular file, and
// hashes it through the open descriptor. The file must be owned by bcd's
// own user and writable by no one else, so its bytes cannot change
// between the hash and the exec. It returns the open file only
// when the SHA-256 matches wantHex; the caller executes that descriptor,
// never path again, so what was hashed is what runs.
func OpenPinned(path, wantHex string) (*os.File, error) {
	want, err := hex.DecodeString(wantHex)
	if err != nil || len(want) != sha256.Size {
		return nil, refuse(CodeHashMismatch, errors.New("pin is not a SHA-256 in hex"))
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, refuse(CodeOpen, fmt.Errorf("open %s: %w", path, err))
	}
	f := os.NewFile(uintptr(fd), path)
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, refuse(CodeNotRegular, err)
	}
	// Hashing a file someone else may write would check bytes that can
	// change in place before the exec: only bcd's own user may write it.
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || int(sys.Uid) != os.Geteuid() || st.Mode().Perm()&0o022 != 0 {
		f.Close()
		return nil, refuse(CodeWritable, errors.New(path))
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		f.Close()
		return nil, refuse(CodeOpen, fmt.Errorf("hash %s: %w", path, err))
	}
	if subtle.ConstantTimeCompare(h.Sum(nil), want) != 1 {
		f.Close()
		return nil, refuse(CodeHashMismatch, errors.New(path))
	}
	return f, nil
}
