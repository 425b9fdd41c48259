//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package chainlog

import "os"

// openFlags adds nothing where O_NOFOLLOW is not available; Open still
// refuses a symlink by Lstat and checks the opened file is the one named.
const openFlags = 0

// checkModeBits is off where permission bits are not the access control
// (Windows: the file's ACL, set by the installer, is).
const checkModeBits = false

// lockFile does not lock where flock(2) is not available.
func lockFile(*os.File) error { return nil }
