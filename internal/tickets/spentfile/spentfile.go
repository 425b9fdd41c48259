// Package spentfile is a node's spent-ticket store that outlives its
// process: the jtis bcd accepted, each written to a file in its data
// folder (and fsynced) before the ticket it came with is honoured, and read
// back when bcd starts. A ticket spent before a restart is refused as
// spent after it, whatever the node's clock says; an in-memory store alone
// left that to a comparison of the ticket's issue time with the process's
// start, which a node whose clock is slow gets wrong.
//
// The file is JSON lines, one spent jti and its ticket's expiry each,
// mode 0600. It is compacted when opened and whenever as many lines were
// appended since the last compaction as the store may hold jtis: the
// entries past their keeping time are dropped (tickets.Retention after the
// expiry, as tickets.Memory keeps them), so it stays within twice the
// store's capacity. A last line without its newline (a crash mid-append)
// is ignored: the ticket it recorded was not yet honoured. Any other line
// that does not parse is a damaged file, which Open refuses rather than
// forget the lines after it. A write that fails (the folder
// full or read-only) refuses its ticket and leaves the file to be
// rewritten whole, from memory, before anything is appended to it again,
// so no line is ever lost behind a broken one.
package spentfile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// entry is one line of the file.
type entry struct {
	JTI       string `json:"jti"`
	ExpiresMS int64  `json:"exp"`
}

// maxLine bounds a line: a jti is at most tickets' own bound, far below.
const maxLine = 4 << 10

// Store is a tickets.Spent that survives a restart. It is safe for
// concurrent use; spends are serialized (each waits for its fsync).
type Store struct {
	path     string
	capacity int

	mu       sync.Mutex
	mem      *tickets.Memory
	appended int  // lines appended since the last compaction
	stale    bool // the file may not hold what mem holds: rewrite it first
	// compactErr is why Open could not compact the file (nil when it did).
	compactErr error
}

// Open reads the store at path, keeping the jtis still within their
// keeping time by clk, and compacts the file (creating it 0600). A file
// that cannot be read is an error; a compaction that cannot be written
// (the folder full or read-only) is not (see CompactErr): the store then
// refuses every spend it cannot write. capacity bounds the unexpired jtis
// held, as in tickets.NewMemory (DefaultMemoryCapacity when <= 0).
func Open(path string, clk clock.Clock, capacity int) (*Store, error) {
	if capacity <= 0 {
		capacity = tickets.DefaultMemoryCapacity
	}
	s := &Store{path: path, capacity: capacity, mem: tickets.NewMemory(clk, capacity)}
	if err := s.load(); err != nil {
		return nil, err
	}
	if err := s.compact(); err != nil {
		s.stale, s.compactErr = true, err
	}
	return s, nil
}

// CompactErr returns why Open could not compact the file (nil when it
// did).
func (s *Store) CompactErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.compactErr
}

// load spends every jti of the file in memory; the expired ones are
// dropped by the memory store itself. Only a last line without its
// newline (a crash mid-append) is skipped: any other line that does not
// parse is an error, never a reason to forget the lines after it.
func (s *Store) load() error {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("spentfile: read: %w", err)
	}
	lines := bytes.Split(b, []byte("\n"))
	// The last element follows the last newline: empty, or a torn line.
	for i, line := range lines[:len(lines)-1] {
		var e entry
		if len(line) > maxLine || json.Unmarshal(line, &e) != nil || e.JTI == "" {
			return fmt.Errorf("spentfile: %s line %d is not a spent ticket: the file is damaged", s.path, i+1)
		}
		// Past capacity too: the file can hold more unexpired jtis than
		// the store may (a clock set back); they are all kept, and spends
		// are refused ErrFull until enough expire.
		s.mem.Restore(e.JTI, time.UnixMilli(e.ExpiresMS))
	}
	return nil
}

// Spend records jti, whose ticket expires at expires: ErrSpent when it was
// spent before (in this process or, read back from the file, an earlier
// one), ErrFull when the store is full, and any other error when it could
// not be written durably, which refuses the ticket (the jti then stays
// spent in memory: it is refused again, never honoured).
func (s *Store) Spend(ctx context.Context, jti string, expires time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.mem.Spend(ctx, jti, expires); err != nil {
		return err
	}
	if s.stale || s.appended >= s.capacity {
		if err := s.compact(); err != nil {
			s.stale = true
			return err
		}
		s.stale = false
		return nil
	}
	if err := s.append(entry{JTI: jti, ExpiresMS: expires.UnixMilli()}); err != nil {
		s.stale = true // a partial line may be in the file
		return err
	}
	s.appended++
	return nil
}

// append writes one line and fsyncs it.
func (s *Store) append(e entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("spentfile: encode: %w", err)
	}
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("spentfile: open for append: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("spentfile: append: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("spentfile: sync: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("spentfile: close: %w", err)
	}
	return nil
}

// compact rewrites the file with what memory holds (atomicfile: a crash
// leaves the old file or the new one).
func (s *Store) compact() error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	s.mem.Each(func(jti string, expires time.Time) {
		_ = enc.Encode(entry{JTI: jti, ExpiresMS: expires.UnixMilli()})
	})
	if err := atomicfile.Write(s.path, buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("spentfile: compact: %w", err)
	}
	s.appended = 0
	return nil
}
