package hostops

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/sshca"
)

// File kinds bcd writes (DefaultFiles): the break-glass sshd files of
// internal/sshca (sshca.WriteSSHDFiles) and sshd_config drop-ins.
const (
	KindSSHCA         = "ssh-ca"         // <sshd-dir>/trusted_user_ca_keys.pub, id "default"
	KindSSHKRL        = "ssh-krl"        // <sshd-dir>/revoked_keys.krl, id "default"
	KindSSHPrincipals = "ssh-principals" // <sshd-dir>/principals/<account>
	KindSSHDDropin    = "sshd-dropin"    // <dropin-dir>/bcd-<id>.conf
)

// Bounds on a file request.
const (
	// MaxFileSize is the largest file WriteFile writes.
	MaxFileSize = 1 << 20
	// MaxFileID is the longest id.
	MaxFileID = 64
	// FixedID is the only id a kind with a fixed name (no IDToken in its
	// Name) accepts.
	FixedID = "default"
	// IDToken in a FileKind's Name is replaced by the id.
	IDToken = "{id}"
)

// DefaultSSHDDropinDir is where sshd reads drop-in configuration
// (Include /etc/ssh/sshd_config.d/*.conf in Debian's sshd_config).
const DefaultSSHDDropinDir = "/etc/ssh/sshd_config.d"

// FileKind says where the files of one kind go: the directory Dir (an
// absolute, clean path), the file name Name (one path component, with
// IDToken standing for the id, or without it for a single file whose id
// must be FixedID), and the mode Mode (permission bits only, never group-
// or other-writable). With MakeDirs, WriteFile creates missing
// directories on the way to Dir (root's, 0755); without it a missing
// directory is an error (CodeFailed). Either way every directory from /
// down to Dir must be root's, not a symlink, and closed to group and
// other writes.
type FileKind struct {
	Dir      string
	Name     string
	Mode     fs.FileMode
	MakeDirs bool
}

// DefaultFiles returns the file kinds bcd writes today: the break-glass
// sshd files under sshdDir (what sshca.WriteSSHDFiles writes, 0644 as
// sshd's StrictModes wants) and sshd_config drop-ins under dropinDir. The
// sshd directories are made when missing, as WriteSSHDFiles does; the
// drop-in directory must exist (sshd's package makes it, and a missing
// one means sshd would not read the file anyway).
func DefaultFiles(sshdDir, dropinDir string) map[string]FileKind {
	return map[string]FileKind{
		KindSSHCA:         {Dir: sshdDir, Name: sshca.CAKeyFile, Mode: sshca.FileMode, MakeDirs: true},
		KindSSHKRL:        {Dir: sshdDir, Name: sshca.KRLFile, Mode: sshca.FileMode, MakeDirs: true},
		KindSSHPrincipals: {Dir: filepath.Join(sshdDir, sshca.PrincipalsDir), Name: IDToken, Mode: sshca.FileMode, MakeDirs: true},
		KindSSHDDropin:    {Dir: dropinDir, Name: "bcd-" + IDToken + ".conf", Mode: 0o644},
	}
}

// Validate reports whether k is a usable kind: the helper checks its
// table with it at start, and every operation checks the kind it uses.
func (k FileKind) Validate() error {
	if !filepath.IsAbs(k.Dir) || filepath.Clean(k.Dir) != k.Dir {
		return fmt.Errorf("hostops: kind directory %q is not an absolute, clean path", k.Dir)
	}
	if k.Name == "" || strings.ContainsAny(k.Name, "/\x00") || strings.Count(k.Name, IDToken) > 1 {
		return fmt.Errorf("hostops: kind file name %q must be one path component with at most one %s", k.Name, IDToken)
	}
	if strings.Count(k.Name, IDToken) == 0 && checkID(k.Name) != nil {
		return fmt.Errorf("hostops: kind file name %q is not a plain file name", k.Name)
	}
	if k.Mode&^fs.ModePerm != 0 || k.Mode&0o022 != 0 {
		return fmt.Errorf("hostops: kind mode %v must be permission bits without group or other write", k.Mode)
	}
	return nil
}

// ValidateFiles checks every kind of o.Files.
func (o *Ops) ValidateFiles() error {
	for name, k := range o.Files {
		if err := k.Validate(); err != nil {
			return fmt.Errorf("hostops: file kind %s: %w", name, err)
		}
	}
	return nil
}

// checkID refuses (CodeFileID) an id that is empty, longer than
// MaxFileID, starts with '.', or holds a byte outside [A-Za-z0-9._-]
// (so no '/', NUL or space) or "..".
func checkID(id string) error {
	if id == "" || len(id) > MaxFileID {
		return refuse(helperwire.CodeFileID, "id must be 1 to %d bytes", MaxFileID)
	}
	if id[0] == '.' || strings.Contains(id, "..") {
		return refuse(helperwire.CodeFileID, "id must not start with '.' or hold \"..\"")
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return refuse(helperwire.CodeFileID, "id byte %d is outside [A-Za-z0-9._-]", i)
		}
	}
	return nil
}

// target resolves kind and id to the kind and the file's name in its
// directory, or refuses (CodeFileKind, CodeFileID).
func (o *Ops) target(kind, id string) (FileKind, string, error) {
	k, ok := o.Files[kind]
	if !ok {
		return FileKind{}, "", refuse(helperwire.CodeFileKind, "file kind %q is not in the helper's table", kind)
	}
	if err := k.Validate(); err != nil {
		return FileKind{}, "", fmt.Errorf("hostops: file kind %s: %w", kind, err)
	}
	if err := checkID(id); err != nil {
		return FileKind{}, "", err
	}
	if !strings.Contains(k.Name, IDToken) {
		if id != FixedID {
			return FileKind{}, "", refuse(helperwire.CodeFileID, "kind %s takes only the id %q", kind, FixedID)
		}
		return k, k.Name, nil
	}
	return k, strings.Replace(k.Name, IDToken, id, 1), nil
}

// checkDir refuses a directory on the way down: a symlink
// (CodePathSymlink), not a directory (CodePathNotDir), not root's
// (CodePathOwner), or writable by group or other, sticky or not
// (CodePathWritable).
func checkDir(path string, fi fs.FileInfo) error {
	if fi.Mode()&fs.ModeSymlink != 0 {
		return refuse(helperwire.CodePathSymlink, "%s is a symlink", path)
	}
	if !fi.IsDir() {
		return refuse(helperwire.CodePathNotDir, "%s is not a directory", path)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid != 0 {
		return refuse(helperwire.CodePathOwner, "%s is not owned by root", path)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return refuse(helperwire.CodePathWritable, "%s is writable by group or other", path)
	}
	return nil
}

// walkDir checks every directory from / down to dir with Lstat (never
// following a symlink). A missing directory is made (root's, 0755) when
// mkdir is set, else it is an error wrapping fs.ErrNotExist. Since every
// directory checked is root's and closed to others, only root can change
// what a later component names, so the checks still hold when the file is
// opened below.
func walkDir(dir string, mkdir bool) error {
	path := "/"
	parts := strings.Split(strings.TrimPrefix(dir, "/"), "/")
	for i := -1; i < len(parts); i++ {
		if i >= 0 {
			if parts[i] == "" {
				continue
			}
			path = filepath.Join(path, parts[i])
		}
		fi, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) && mkdir {
			fi, err = makeDir(path)
		}
		if err != nil {
			return fmt.Errorf("hostops: %s: %w", path, err)
		}
		if err := checkDir(path, fi); err != nil {
			return err
		}
	}
	return nil
}

// makeDir makes path (root's, 0755 whatever the umask) and returns its
// Lstat. Mkdir does not follow a symlink at path: one planted there makes
// it fail with EEXIST, and the Lstat then shows the symlink.
func makeDir(path string) (fs.FileInfo, error) {
	if err := os.Mkdir(path, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	fi, err := os.Lstat(path)
	if err != nil || !fi.IsDir() {
		return fi, err
	}
	if fi.Mode().Perm() != 0o755 {
		if err := os.Chmod(path, 0o755); err != nil { // not a symlink: Lstat says a directory, and only root can swap it
			return nil, err
		}
		return os.Lstat(path)
	}
	return fi, nil
}

// WriteFile writes data as the file of kind and id, atomically (a reader
// sees the old or the new content), with the kind's mode, root's. It
// refuses a kind not in the table (CodeFileKind), a bad id (CodeFileID),
// data over MaxFileSize (CodeFileTooLarge), a directory on the way that
// is a symlink, not a directory, not root's or open to others' writes
// (CodePath*), and a symlink at the target (CodePathSymlink). The file is
// written as a temp file beside the target (O_EXCL|O_NOFOLLOW), fsynced,
// renamed over the target (rename replaces a name, never follows one),
// and the directory is fsynced.
func (o *Ops) WriteFile(kind, id string, data []byte) error {
	k, name, err := o.target(kind, id)
	if err != nil {
		return err
	}
	if len(data) > MaxFileSize {
		return refuse(helperwire.CodeFileTooLarge, "%d bytes is over %d", len(data), MaxFileSize)
	}
	if err := walkDir(k.Dir, k.MakeDirs); err != nil {
		return err
	}
	root, err := os.OpenRoot(k.Dir)
	if err != nil {
		return fmt.Errorf("hostops: open %s: %w", k.Dir, err)
	}
	defer root.Close()
	if err := checkTarget(root, k.Dir, name); err != nil {
		return err
	}
	return writeIn(root, k.Dir, name, data, k.Mode)
}

// checkTarget refuses a symlink (CodePathSymlink) or anything but a
// regular file at name in root; a missing name is fine.
func checkTarget(root *os.Root, dir, name string) error {
	fi, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("hostops: %s: %w", filepath.Join(dir, name), err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return refuse(helperwire.CodePathSymlink, "%s is a symlink", filepath.Join(dir, name))
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("hostops: %s is not a regular file", filepath.Join(dir, name))
	}
	return nil
}

// writeIn writes name in root through a temp file, as WriteFile says.
func writeIn(root *os.Root, dir, name string, data []byte, mode fs.FileMode) error {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("hostops: temp name: %w", err)
	}
	tmp := "." + name + ".tmp-" + hex.EncodeToString(rnd[:])
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("hostops: create temp in %s: %w", dir, err)
	}
	defer root.Remove(tmp) // after the rename it finds nothing
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
		err = root.Rename(tmp, name)
	}
	if err == nil {
		err = syncRoot(root)
	}
	if err != nil {
		return fmt.Errorf("hostops: write %s: %w", filepath.Join(dir, name), err)
	}
	return nil
}

// syncRoot fsyncs root's directory, so a name made or removed in it
// survives a crash.
func syncRoot(root *os.Root) error {
	d, err := root.Open(".")
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// RemoveFile removes the file of kind and id, with WriteFile's checks: a
// symlink at the target is refused (CodePathSymlink), never followed nor
// removed. A missing file, or a missing directory, is not an error: the
// file is gone either way.
func (o *Ops) RemoveFile(kind, id string) error {
	k, name, err := o.target(kind, id)
	if err != nil {
		return err
	}
	if err := walkDir(k.Dir, false); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	root, err := os.OpenRoot(k.Dir)
	if err != nil {
		return fmt.Errorf("hostops: open %s: %w", k.Dir, err)
	}
	defer root.Close()
	if err := checkTarget(root, k.Dir, name); err != nil {
		return err
	}
	if err := root.Remove(name); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("hostops: remove %s: %w", filepath.Join(k.Dir, name), err)
	}
	if err := syncRoot(root); err != nil {
		return fmt.Errorf("hostops: sync %s: %w", k.Dir, err)
	}
	return nil
}
