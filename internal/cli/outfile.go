package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

// Every file a command writes through --out goes through this file: it is
// created with O_EXCL, so an existing file (or a symlink in its place) is
// refused and left as it was, unless --force is given, in which case the
// new content replaces it atomically (temp file and rename). The file gets
// exactly the mode asked for (the umask does not widen or narrow it):
// 0600 for anything that holds a secret.

// Modes of --out files.
const (
	secretFileMode os.FileMode = 0o600
	publicFileMode os.FileMode = 0o644
)

// forceFlag registers --force on c, the flag that lets its --out replace
// an existing file.
func forceFlag(c *cobra.Command, force *bool) {
	c.Flags().BoolVar(force, "force", false, "replace the --out file if it exists (without it an existing file is refused)")
}

// outFile is an --out file reserved before its content is known (so that a
// command that mints a secret refuses an existing file before minting it):
// Commit writes the content, Abort gives the name back.
type outFile struct {
	path  string
	force bool
	f     *os.File // the target itself (O_EXCL), or a temp file beside it (force)
}

// errOutExists is the refusal of an existing --out file.
func errOutExists(path string) error {
	return &ExitError{Code: 1, Err: fmt.Errorf("%s already exists and was left as it is: choose another --out, or add --force to replace it", path)}
}

// openOut reserves path for a file of mode perm: it creates it with O_EXCL,
// or with force a temp file in the same directory that Commit renames over
// it. An existing path without force is refused (exit 1, naming --force).
func openOut(path string, force bool, perm os.FileMode) (*outFile, error) {
	if path == "" {
		return nil, &ExitError{Code: 2, Err: errors.New("--out needs a file name")}
	}
	var f *os.File
	var err error
	if force {
		// --force replaces a file (or a symlink's name), never a
		// directory or a device: refused now, before anything is minted,
		// rather than when Commit's rename fails.
		if fi, lerr := os.Lstat(path); lerr == nil && !fi.Mode().IsRegular() && fi.Mode()&fs.ModeSymlink == 0 {
			return nil, &ExitError{Code: 1, Err: fmt.Errorf("%s exists and is not a file: --force replaces only a file", path)}
		}
		// The temp file beside it reserves the write now (the directory is
		// writable) and is renamed over path by Commit. atomicfile.Write
		// would only be called after the secret is minted.
		f, err = os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	} else {
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	}
	if errors.Is(err, fs.ErrExist) {
		return nil, errOutExists(path)
	}
	if err != nil {
		return nil, &ExitError{Code: 1, Err: fmt.Errorf("create %s: %w", path, err)}
	}
	o := &outFile{path: path, force: force, f: f}
	// The umask narrowed O_CREATE's mode, and CreateTemp makes 0600: set
	// the mode asked for.
	if err := f.Chmod(perm); err != nil {
		o.Abort()
		return nil, &ExitError{Code: 1, Err: fmt.Errorf("create %s: %w", path, err)}
	}
	return o, nil
}

// Commit writes data, syncs it and publishes the file under its name.
func (o *outFile) Commit(data []byte) error {
	_, err := o.f.Write(data)
	if err == nil {
		err = o.f.Sync()
	}
	if cerr := o.f.Close(); err == nil {
		err = cerr
	}
	if err == nil && o.force {
		err = os.Rename(o.f.Name(), o.path)
	}
	if err != nil {
		_ = os.Remove(o.f.Name())
		return &ExitError{Code: 1, Err: fmt.Errorf("write %s: %w", o.path, err)}
	}
	if d, err := os.Open(filepath.Dir(o.path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// Abort closes and removes the reserved file (without force, the target:
// it was made by openOut, so nothing of the user's is lost).
func (o *outFile) Abort() {
	_ = o.f.Close()
	_ = os.Remove(o.f.Name())
}

// writeOut writes data to the --out file path with mode perm: a new file,
// or with force a replacement of an existing one.
func writeOut(path string, force bool, data []byte, perm os.FileMode) error {
	o, err := openOut(path, force, perm)
	if err != nil {
		return err
	}
	return o.Commit(data)
}

// refuseExisting refuses (exit 1, naming --force) when any of paths exists
// and force is not set: for the commands whose --out is a directory of
// files they write themselves.
func refuseExisting(force bool, paths ...string) error {
	if force {
		return nil
	}
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			return errOutExists(p)
		}
	}
	return nil
}

// replaceApproverFiles refuses (exit 1) approver key files already in dir,
// or with force removes them so that approvers init makes new ones.
func replaceApproverFiles(dir string, count int, force bool) error {
	var paths []string
	for i := 1; i <= count; i++ {
		base := filepath.Join(dir, fmt.Sprintf("approver-%d", i))
		paths = append(paths, base+".key", base+".pub")
	}
	if err := refuseExisting(force, paths...); err != nil || !force {
		return err
	}
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return &ExitError{Code: 1, Err: fmt.Errorf("replace %s: %w", p, err)}
		}
	}
	return nil
}
