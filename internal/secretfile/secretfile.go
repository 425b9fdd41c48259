// Package secretfile reads files that hold a secret (an approver's private
// key, an API key): a file group or other may read or write is refused, as
// ssh refuses an open private key, so a secret left readable is found
// before it is used rather than after it leaks.
package secretfile

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// MaxSize bounds a secret file: these are keys, never large.
const MaxSize = 64 << 10

// ErrOpen is wrapped by the error for a file group or other may access.
var ErrOpen = errors.New("accessible to group or other")

// Read returns the contents of the secret file at path, refusing one whose
// mode gives group or other any permission (checked on the opened file, so
// the file read is the file checked) or that is larger than MaxSize. what
// names the file in errors (such as "BC_API_KEY_FILE").
func Read(what, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s %s is %w (mode %04o); chmod 600 it", what, path, ErrOpen, perm)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %s is not a regular file", what, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(b) > MaxSize {
		return nil, fmt.Errorf("%s %s is larger than %d bytes", what, path, MaxSize)
	}
	return b, nil
}
