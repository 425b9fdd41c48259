//go:build !linux && !darwin

package share

import (
	"errors"
	"os"
)

// openFlags opens a resolved path for reading.
const openFlags = os.O_RDONLY

// renameNoReplace refuses: this system offers no rename that never
// replaces, and a move must never overwrite.
func renameNoReplace(fromDir *os.File, from string, toDir *os.File, to string) error {
	return errors.New("share: moves are not supported on this system")
}
