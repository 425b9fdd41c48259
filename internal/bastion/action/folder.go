package action

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"
	"syscall"
)

// noFollow makes an open fail on a link at the last component.
const noFollow = syscall.O_NOFOLLOW

// readEffect reads the effect p through root: exists is false when there
// is nothing at p. Something there that is not a regular file (a link
// included), or that a link in its path leads out of root, is refused
// with ReasonEffectNotFile; over MaxEffectBytes with ReasonEffectTooLarge.
func readEffect(root *os.Root, p string) (data []byte, mode fs.FileMode, exists bool, err error) {
	fi, err := root.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, 0, false, nil
	case err != nil:
		// A link out of the folder in p's path, or a file in the way.
		return nil, 0, false, refuse(ReasonEffectNotFile, strconv.Quote(p))
	case !fi.Mode().IsRegular():
		return nil, 0, false, refuse(ReasonEffectNotFile, strconv.Quote(p))
	case fi.Size() > MaxEffectBytes:
		return nil, 0, false, refuse(ReasonEffectTooLarge, strconv.Quote(p))
	}
	f, err := root.OpenFile(p, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return nil, 0, false, refuse(ReasonEffectNotFile, strconv.Quote(p))
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, 0, false, refuse(ReasonEffectNotFile, strconv.Quote(p))
	}
	data, err = io.ReadAll(io.LimitReader(f, MaxEffectBytes+1))
	if err != nil {
		return nil, 0, false, fmt.Errorf("action: read effect: %w", err)
	}
	if len(data) > MaxEffectBytes {
		return nil, 0, false, refuse(ReasonEffectTooLarge, strconv.Quote(p))
	}
	return data, fi.Mode().Perm(), true, nil
}

// sha256Hex is the hex SHA-256 of b.
func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// currentHash is the hex SHA-256 of the effect p in root, "" when absent.
func currentHash(root *os.Root, p string) (string, error) {
	data, _, exists, err := readEffect(root, p)
	if err != nil || !exists {
		return "", err
	}
	return sha256Hex(data), nil
}

// writeEffect writes data at p through root: parents made (0755), a new
// temporary file beside p filled, synced and renamed over p. A modified
// file keeps its mode; a created one is 0644.
func writeEffect(root *os.Root, p string, data []byte) error {
	mode := fs.FileMode(0o644)
	if fi, err := root.Lstat(p); err == nil {
		if !fi.Mode().IsRegular() {
			return refuse(ReasonEffectNotFile, strconv.Quote(p))
		}
		mode = fi.Mode().Perm()
	}
	if dir := path.Dir(p); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return refuse(ReasonEffectNotFile, strconv.Quote(p))
		}
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := path.Join(path.Dir(p), ".bc-action-"+hex.EncodeToString(rnd[:]))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, mode)
	if err != nil {
		return fmt.Errorf("action: write %s: %w", strconv.Quote(p), err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, p)
	}
	if err != nil {
		_ = root.Remove(tmp)
		return fmt.Errorf("action: write %s: %w", strconv.Quote(p), err)
	}
	return nil
}
