package share

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"
)

// MaxRead is the most bytes Read returns.
const MaxRead = 4 << 20

// maxEntries is the most entries a listing returns, and the most a folder
// being moved may hold (at any depth).
const maxEntries = 10000

// Entry is one file, folder or link, as an op reports it.
type Entry struct {
	Name    string    `json:"name"`
	Type    string    `json:"type"` // file, dir, link or other
	Size    int64     `json:"size"`
	ModTime time.Time `json:"mod_time"`
}

// Move is one move of a plan: From to To, or to the archive when To is "".
type Move struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Folder is an open share: every access goes through an os.Root on its
// folder, after the share's rules.
type Folder struct {
	root  *os.Root
	match *Matcher
	// beforeRename, when set (tests only), runs after a move's checks and
	// just before its rename.
	beforeRename func(Move)
	// beforeOpen, when set (tests only), runs after a path's checks and
	// just before it is opened.
	beforeOpen func(rel string)
}

// OpenFolder opens the share's folder. The folder must still be a folder
// and not a link (ReasonNotADir), and the excludes still valid.
func OpenFolder(s Share) (*Folder, error) {
	m, err := NewMatcher(s.Excludes)
	if err != nil {
		return nil, err
	}
	fi, err := os.Lstat(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, refuse(ReasonNotFound, s.ID)
	}
	if err != nil {
		return nil, fmt.Errorf("share: open folder: %w", err)
	}
	if !fi.IsDir() {
		return nil, refuse(ReasonNotADir, s.ID)
	}
	root, err := os.OpenRoot(s.Path)
	if err != nil {
		return nil, fmt.Errorf("share: open folder: %w", err)
	}
	return &Folder{root: root, match: m}, nil
}

// Close closes the folder's root.
func (f *Folder) Close() error { return f.root.Close() }

// List returns the entries of the folder at rel, by name, leaving out
// every name excluded under rel as given or as resolved. A link is listed
// as a link; where it leads is not shown.
func (f *Folder) List(rel string) ([]Entry, error) {
	r, err := f.resolve(rel, follow)
	if err != nil {
		return nil, err
	}
	if !r.info.IsDir() {
		return nil, refuse(ReasonNotADir, rel)
	}
	dir, err := f.openSame(r, rel)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	des, err := dir.ReadDir(maxEntries + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("share: list: %w", err)
	}
	if len(des) > maxEntries {
		return nil, refuse(ReasonTooLarge, rel)
	}
	given, _ := cleanRel(rel)
	out := []Entry{}
	for _, de := range des {
		name := de.Name()
		if f.held(path.Join(r.rel, name), rel) != nil || f.held(path.Join(given, name), rel) != nil {
			continue
		}
		fi, err := de.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("share: list: %w", err)
		}
		out = append(out, entry(name, fi))
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Stat returns the entry at rel, following a link at its end (so it
// reports what a read would open). The top of the share is named ".".
func (f *Folder) Stat(rel string) (Entry, error) {
	r, err := f.resolve(rel, follow)
	if err != nil {
		return Entry{}, err
	}
	given, _ := cleanRel(rel)
	return entry(path.Base(given), r.info), nil
}

// Read returns the content of the regular file at rel. max <= 0 or over
// MaxRead means MaxRead; a file larger than max is refused
// (ReasonTooLarge), also one that grows past it while read.
func (f *Folder) Read(rel string, max int64) ([]byte, error) {
	if max <= 0 || max > MaxRead {
		max = MaxRead
	}
	r, err := f.resolve(rel, follow)
	if err != nil {
		return nil, err
	}
	if !r.info.Mode().IsRegular() {
		return nil, refuse(ReasonNotAFile, rel)
	}
	if r.info.Size() > max {
		return nil, refuse(ReasonTooLarge, rel)
	}
	fh, err := f.openSame(r, rel)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, max+1))
	if err != nil {
		return nil, fmt.Errorf("share: read: %w", err)
	}
	if int64(len(data)) > max {
		return nil, refuse(ReasonTooLarge, rel)
	}
	return data, nil
}

// openSame opens the resolved path through the root (which refuses an
// escape itself; O_NOFOLLOW refuses a link put at its end since, and
// O_NONBLOCK a FIFO's wait) and requires the file opened to be the one
// resolved (ReasonPathChanged).
func (f *Folder) openSame(r resolved, given string) (*os.File, error) {
	if f.beforeOpen != nil {
		f.beforeOpen(r.rel)
	}
	fh, err := f.root.OpenFile(r.rel, openFlags, 0)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENOTDIR) {
		return nil, refuse(ReasonPathChanged, given)
	}
	if err != nil {
		return nil, fmt.Errorf("share: open: %w", err)
	}
	fi, err := fh.Stat()
	if err != nil || !os.SameFile(fi, r.info) {
		fh.Close()
		return nil, refuse(ReasonPathChanged, given)
	}
	return fh, nil
}

// entry describes fi under name.
func entry(name string, fi fs.FileInfo) Entry {
	t := "other"
	switch {
	case fi.Mode().IsRegular():
		t = "file"
	case fi.IsDir():
		t = "dir"
	case fi.Mode()&fs.ModeSymlink != 0:
		t = "link"
	}
	return Entry{Name: name, Type: t, Size: fi.Size(), ModTime: fi.ModTime().UTC()}
}
