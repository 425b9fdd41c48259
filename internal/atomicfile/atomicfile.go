// Package atomicfile writes whole files so that a reader, or the same
// program after a crash, sees either the old content or the new one,
// never a torn file: a temp file in the same directory gets the content
// and the mode, is fsynced, then takes the target's name (rename, or link
// for WriteNew), and the directory is fsynced so the name survives too.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces (or creates) path with data and mode atomically.
func Write(path string, data []byte, mode os.FileMode) error {
	return write(path, data, mode, false)
}

// WriteNew is Write for a file that must not exist yet: it publishes the
// temp file with link(2), which fails (wrapping fs.ErrExist) if path
// exists, so two writers cannot both create it.
func WriteNew(path string, data []byte, mode os.FileMode) error {
	return write(path, data, mode, true)
}

// write is Write, or WriteNew when noReplace is set. The temp file is
// removed on every path out (after a rename the remove finds nothing;
// after a link it drops the extra name).
func write(path string, data []byte, mode os.FileMode, noReplace bool) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("atomicfile: write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	err = tmp.Chmod(mode)
	if err == nil {
		_, err = tmp.Write(data)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil && noReplace {
		if err = os.Link(tmp.Name(), path); err == nil {
			err = os.Remove(tmp.Name()) // before the dir fsync, so the unlink is durable too
		}
	} else if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("atomicfile: write %s: %w", path, err)
	}
	return nil
}

// syncDir fsyncs a directory, making the names in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
