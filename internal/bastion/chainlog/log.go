package chainlog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// The reasons Open refuses a file (RefusedError.Reason).
const (
	ReasonSymlink      = "log-symlink"       // the path is a symbolic link
	ReasonNotRegular   = "log-not-regular"   // the path is not a regular file
	ReasonInsecureMode = "log-insecure-mode" // the file grants group or other any access
	ReasonLocked       = "log-locked"        // another Log (this or another process) holds it
	ReasonReplaced     = "log-replaced"      // the path changed to another file while it was opened
)

// ReasonFailed is the reason Append refuses after an earlier write or
// fsync failed: what is on disk is then unknown, so nothing more is added.
const ReasonFailed = "log-failed"

// ReasonBadKind is the reason Append refuses an Event whose Kind is not
// ValidKind.
const ReasonBadKind = "log-bad-kind"

// ReasonClosed is the reason Append and Since refuse after Close.
const ReasonClosed = "log-closed"

// RefusedError is a refusal by Open, Append or Since, with a stable Reason.
type RefusedError struct {
	Path   string
	Reason string
}

func (e *RefusedError) Error() string { return "chainlog: " + e.Path + ": " + e.Reason }

// Log is an open chain log; it is safe for concurrent use.
type Log struct {
	path string
	clk  clock.Clock

	mu     sync.Mutex
	f      *os.File
	tail   tail  // the last event written
	size   int64 // bytes of whole lines in the file
	err    error // sticky: set when a write or fsync failed
	closed bool
}

// Open opens the log at path, creating it 0600 if it does not exist, and
// verifies the chain already in it so that Append continues it. It refuses
// (*RefusedError) a symlink, a file that is not regular, one that grants
// group or other any access (on Unix), and one another Log holds; a broken
// chain is refused with its *BrokenError.
func Open(path string, clk clock.Clock) (*Log, error) {
	existed, err := checkPath(path)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|openFlags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("chainlog: open %s: %w", path, err)
	}
	l, err := adopt(path, f, clk)
	if err == nil && !existed {
		err = syncDir(filepath.Dir(path)) // so the new name survives a crash
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return l, nil
}

// syncDir fsyncs directory dir.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("chainlog: sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		return fmt.Errorf("chainlog: sync %s: %w", dir, err)
	}
	return nil
}

// checkPath refuses a path that exists and is not a private regular
// file; existed says whether it exists.
func checkPath(path string) (existed bool, err error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("chainlog: stat %s: %w", path, err)
	}
	return true, checkInfo(path, fi)
}

func checkInfo(path string, fi os.FileInfo) error {
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		return &RefusedError{Path: path, Reason: ReasonSymlink}
	case !fi.Mode().IsRegular():
		return &RefusedError{Path: path, Reason: ReasonNotRegular}
	case checkModeBits && fi.Mode().Perm()&0o077 != 0:
		return &RefusedError{Path: path, Reason: ReasonInsecureMode}
	}
	return nil
}

// adopt checks that f is still the private regular file at path, locks
// it, and verifies its chain.
func adopt(path string, f *os.File, clk clock.Clock) (*Log, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("chainlog: stat %s: %w", path, err)
	}
	li, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("chainlog: stat %s: %w", path, err)
	}
	if err := checkInfo(path, li); err != nil {
		return nil, err
	}
	if err := checkInfo(path, fi); err != nil {
		return nil, err
	}
	if !os.SameFile(fi, li) {
		return nil, &RefusedError{Path: path, Reason: ReasonReplaced}
	}
	if err := lockFile(f); err != nil {
		return nil, &RefusedError{Path: path, Reason: ReasonLocked}
	}
	t, err := scan(io.NewSectionReader(f, 0, fi.Size()), nil)
	if err != nil {
		return nil, fmt.Errorf("chainlog: open %s: %w", path, err)
	}
	return &Log{path: path, clk: clk, f: f, tail: t, size: fi.Size()}, nil
}

// Append writes e as the next event: it sets Seq, TimeMS (from the
// clock), Prev and Hash, cuts Lane, Reason, Peer and Detail to
// MaxFieldBytes (and replaces invalid UTF-8), writes the line in one
// write and fsyncs it. It returns the event as written. After a failed
// write or fsync every later Append is refused (ReasonFailed).
func (l *Log) Append(e Event) (Event, error) {
	if !ValidKind(e.Kind) {
		return Event{}, &RefusedError{Path: l.path, Reason: ReasonBadKind}
	}
	e.Lane, e.Reason, e.Peer, e.Detail = cut(e.Lane), cut(e.Reason), cut(e.Peer), cut(e.Detail)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return Event{}, &RefusedError{Path: l.path, Reason: ReasonClosed}
	}
	if l.err != nil {
		return Event{}, &RefusedError{Path: l.path, Reason: ReasonFailed}
	}
	e.Seq = l.tail.seq + 1
	e.TimeMS = l.clk.Now().UnixMilli()
	e.Prev = l.tail.hash
	var line []byte
	e.Hash, line = seal(e)
	line = append(line, '\n')
	n, err := l.f.Write(line)
	if err == nil {
		err = l.f.Sync()
	}
	if err != nil {
		l.err = err
		return Event{}, fmt.Errorf("chainlog: append to %s: %w", l.path, err)
	}
	l.tail = tail{seq: e.Seq, hash: e.Hash}
	l.size += int64(n)
	return e, nil
}

// cut makes s valid UTF-8 and at most MaxFieldBytes long, cutting at a
// character boundary.
func cut(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= MaxFieldBytes {
		return s
	}
	s = s[:MaxFieldBytes]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// Since returns the events with Seq > seq, at most max of them, in order,
// for forwarding to the control plane. It re-verifies the chain up to the
// last event it returns, so a file changed under the Log is reported as a
// *BrokenError rather than forwarded.
func (l *Log) Since(seq uint64, max int) ([]Event, error) {
	l.mu.Lock()
	f, size, closed := l.f, l.size, l.closed
	l.mu.Unlock()
	if closed {
		return nil, &RefusedError{Path: l.path, Reason: ReasonClosed}
	}
	var out []Event
	if max <= 0 {
		return out, nil
	}
	_, err := scan(io.NewSectionReader(f, 0, size), func(e Event) bool {
		if e.Seq > seq {
			out = append(out, e)
		}
		return len(out) < max
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Close closes the file (releasing its lock). Later calls do nothing.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("chainlog: close %s: %w", l.path, err)
	}
	return nil
}
