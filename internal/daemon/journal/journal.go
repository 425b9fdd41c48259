// Package journal is bcd's crash-safe command journal: an append-only file
// of JSON lines. A command is journaled before it runs ("start") and after
// ("done", with its signed update); the gateway's ack is journaled too.
// After a restart a command that started but never finished is not run
// again (it is reported failed, reason interrupted), results not yet
// acknowledged are sent again, and every id ever seen is refused as a
// replay until its expiry has passed.
//
// Which entries are fsynced: "start" and "done" are fsynced before Start
// and Done return, so the step they guard (running the driver; sending the
// update and treating the id as seen) never happens unless the entry
// survives a crash. "ack" is appended without fsync (the file is still
// opened, appended to and closed, so the entry is in the journal for every
// later read, and Open's compaction fsyncs it with the rest): a lost ack
// only makes the node send that final update again after a crash, and the
// control plane acknowledges it again without changing anything, because
// it ignores updates to commands already final. Losing an ack therefore
// never runs a command twice nor unseats a replay refusal, which both rest
// on "start" and "done". Nor can an unsynced ack tear the journal in the
// middle: fsync covers the whole file, so the next "start" or "done" makes
// every earlier ack durable too, and an ack a crash loses or tears is at
// the tail, where the loader already stops at a torn line.
//
// When the journal cannot be written (its folder full or read-only): a
// "start" that fails is not journaled, so the command does not run. A
// "done" or "ack" that fails is kept in memory only (the call returns an
// error wrapping ErrNotDurable and the cause): the id counts as seen and
// its update is answered and sent, and the entry reaches the file at the
// next write that succeeds. Any failed write (a failed append may leave a
// partial line, and a failed compaction a torn tail) marks the file
// stale, and the next write rewrites the whole journal from memory
// (atomicfile) before anything is appended to it, so a line written after
// the fault is never lost behind a broken one.
package journal

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// Entry is one line of the journal.
type Entry struct {
	Op        string `json:"op"` // start, done, ack
	ID        string `json:"id"`
	ExpiresMS int64  `json:"exp,omitempty"`
	Update    []byte `json:"update,omitempty"` // a marshalled CommandUpdate
	// Kind and PayloadSHA256 name the started command (see StartCommand),
	// so an update signed after a crash still names what ran.
	Kind          string `json:"kind,omitempty"`
	PayloadSHA256 []byte `json:"payload_sha256,omitempty"`
}

// Record is the journal's view of one command.
type Record struct {
	ID        string
	ExpiresMS int64
	Started   bool
	Done      bool
	Acked     bool
	Update    []byte
	// Kind and PayloadSHA256 are those StartCommand recorded.
	Kind          string
	PayloadSHA256 []byte
	// Seq orders the finished records: the later its "done" entry was
	// journaled, the higher (0 while not done). Results are sent in this
	// order, so the control plane sees them in the order the node
	// produced them.
	Seq uint64
}

// Journal is an open journal; it is safe for concurrent use. It holds no
// file descriptor between appends, so one process can keep the journals
// of many simulated nodes.
type Journal struct {
	mu      sync.Mutex
	path    string
	records map[string]*Record
	seq     uint64 // the last Record.Seq given
	// stale is set when the file may not hold what records hold (a write
	// or the compaction failed): the next write rewrites it first.
	stale bool
	// compactErr is why Open's compaction failed (nil when it did not).
	compactErr error
}

// ErrNotDurable is wrapped (with the cause) by Done, Refuse and Ack when
// the entry could not be written and is kept in memory only: the id is
// seen and its update stands in this process, and the entry is written at
// the next write that succeeds. Test with errors.Is; the cause (ENOSPC,
// EROFS, ...) is in the same chain.
var ErrNotDurable = errors.New("journal: entry kept in memory only")

// maxLine bounds a journal line: an entry holds one marshalled
// CommandUpdate (at most nodev1.MaxMessageBytes), base64 in JSON, plus the
// entry's own few fields.
const maxLine = (nodev1.MaxMessageBytes+2)/3*4 + 64<<10

// Open reads the journal at path (creating it 0600), compacts away commands
// that are acknowledged and expired more than keep ago as of now, and
// returns it ready for appends. A compaction that cannot be written (the
// folder full or read-only) does not stop it: the journal is read, its
// results can be sent, and the next write rewrites the file (see
// CompactErr).
func Open(path string, now time.Time, keep time.Duration) (*Journal, error) {
	j := &Journal{path: path, records: map[string]*Record{}}
	if err := j.load(); err != nil {
		return nil, err
	}
	cutoff := now.Add(-keep).UnixMilli()
	for id, r := range j.records {
		if r.Acked && r.ExpiresMS < cutoff {
			delete(j.records, id)
		}
	}
	if err := j.rewrite(); err != nil {
		j.stale, j.compactErr = true, err
	}
	return j, nil
}

// CompactErr returns why Open could not compact the journal (nil when it
// did): the file is then rewritten by the next write that succeeds.
func (j *Journal) CompactErr() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.compactErr
}

func (j *Journal) load() error {
	f, err := os.Open(j.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("journal: open: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		var e Entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// A torn last line from a crash mid-append: stop there. What it
			// recorded did not happen as far as the journal knows, and the
			// step it guarded had not begun.
			break
		}
		j.apply(e)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("journal: read: %w", err)
	}
	return nil
}

func (j *Journal) apply(e Entry) {
	r := j.records[e.ID]
	if r == nil {
		r = &Record{ID: e.ID}
		j.records[e.ID] = r
	}
	switch e.Op {
	case "start":
		r.Started = true
		if e.Kind != "" {
			r.Kind, r.PayloadSHA256 = e.Kind, e.PayloadSHA256
		}
		if e.ExpiresMS > r.ExpiresMS {
			r.ExpiresMS = e.ExpiresMS
		}
	case "done":
		r.Done = true
		r.Update = e.Update
		j.seq++
		r.Seq = j.seq
		if e.ExpiresMS > r.ExpiresMS {
			r.ExpiresMS = e.ExpiresMS
		}
	case "ack":
		r.Acked = true
	}
}

// rewrite writes the current records to a temp file and renames it over
// the journal (atomicfile), so a crash leaves either the old or the new
// file. Unfinished records come first (by id), then finished ones in
// their Seq order, so reading the file back keeps that order.
func (j *Journal) rewrite() error {
	ids := make([]string, 0, len(j.records))
	for id := range j.records {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(a, b int) bool {
		ra, rb := j.records[ids[a]], j.records[ids[b]]
		if ra.Seq != rb.Seq {
			return ra.Seq < rb.Seq
		}
		return ids[a] < ids[b]
	})
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, id := range ids {
		r := j.records[id]
		if r.Started {
			_ = enc.Encode(Entry{Op: "start", ID: id, ExpiresMS: r.ExpiresMS, Kind: r.Kind, PayloadSHA256: r.PayloadSHA256})
		}
		if r.Done {
			_ = enc.Encode(Entry{Op: "done", ID: id, ExpiresMS: r.ExpiresMS, Update: r.Update})
		}
		if r.Acked {
			_ = enc.Encode(Entry{Op: "ack", ID: id})
		}
	}
	if err := atomicfile.Write(j.path, buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("journal: compact: %w", err)
	}
	return nil
}

// append writes one entry, fsyncing it when durable is set, then applies
// it; keep says whether an entry that cannot be written is kept in memory
// (see ErrNotDurable).
func (j *Journal) append(e Entry, durable, keep bool) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.appendLocked(e, durable, keep)
}

// appendIfNew appends e only if its id was never journaled, and reports
// whether it did: the check and the append happen under one hold of j.mu,
// so of two callers with one id exactly one appends. With keep, an entry
// that cannot be written is kept in memory and counts as appended (with
// an error wrapping ErrNotDurable).
func (j *Journal) appendIfNew(e Entry, keep bool) (bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.records[e.ID]; ok {
		return false, nil
	}
	err := j.appendLocked(e, true, keep)
	if err != nil && !errors.Is(err, ErrNotDurable) {
		return false, err
	}
	return true, err
}

// appendLocked is append with j.mu held. A stale file is rewritten from
// memory before e is appended; a failed write leaves it stale.
func (j *Journal) appendLocked(e Entry, durable, keep bool) error {
	err := j.writeLocked(e, durable)
	if err == nil {
		j.apply(e)
		return nil
	}
	j.stale = true
	if keep {
		j.apply(e)
		return fmt.Errorf("%w: %w", ErrNotDurable, err)
	}
	return err
}

// writeLocked brings a stale file up to date (a rewrite from memory),
// then appends e to it.
func (j *Journal) writeLocked(e Entry, durable bool) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("journal: encode: %w", err)
	}
	if j.stale {
		if err := j.rewrite(); err != nil {
			return err
		}
		j.stale = false
	}
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("journal: open for append: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("journal: append: %w", err)
	}
	if durable {
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("journal: sync: %w", err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("journal: close: %w", err)
	}
	return nil
}

// Flush writes what only memory holds (entries kept after a failed write,
// a compaction that failed) to the file, and reports whether the file
// now holds every entry. It does nothing when nothing is pending.
func (j *Journal) Flush() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.stale {
		return nil
	}
	if err := j.rewrite(); err != nil {
		return err
	}
	j.stale = false
	return nil
}

// Seen reports whether id was ever journaled (a replay when true).
func (j *Journal) Seen(id string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	_, ok := j.records[id]
	return ok
}

// Final returns the signed final update journaled for id, if id is done.
// A node answers a replayed command with it: the answer it gave the first
// time, which changes nothing the control plane recorded.
func (j *Journal) Final(id string) ([]byte, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	r := j.records[id]
	if r == nil || !r.Done {
		return nil, false
	}
	return r.Update, true
}

// Start records that id is about to run; the entry is fsynced before Start
// returns, so a command never runs unless its start survives a crash.
func (j *Journal) Start(id string, expires time.Time) error {
	return j.append(Entry{Op: "start", ID: id, ExpiresMS: expires.UnixMilli()}, true, false)
}

// StartCommand is Start that also records the command's kind and the
// SHA-256 of its payload, which the update signed after a crash
// ("interrupted") names.
func (j *Journal) StartCommand(id string, expires time.Time, kind string, payloadSHA256 []byte) error {
	return j.append(Entry{Op: "start", ID: id, ExpiresMS: expires.UnixMilli(), Kind: kind, PayloadSHA256: payloadSHA256}, true, false)
}

// Begin is StartCommand for an id never journaled before, in one step: it
// reports false, and journals nothing, when id was already seen (started,
// refused or done). Two deliveries of one command that reach two workers
// at once (the old session's and the new one's) may both pass an earlier
// Seen check; only one of them gets true from Begin and runs the command.
func (j *Journal) Begin(id string, expires time.Time, kind string, payloadSHA256 []byte) (bool, error) {
	return j.appendIfNew(Entry{Op: "start", ID: id, ExpiresMS: expires.UnixMilli(), Kind: kind, PayloadSHA256: payloadSHA256}, false)
}

// Refuse is Done for an id never journaled before (a refused command), in
// one step: it reports false, and journals nothing, when id was already
// seen, so a refusal never overwrites or contradicts what the node did
// with another copy of the command. A refusal that cannot be written is
// kept in memory (true, and an error wrapping ErrNotDurable): the id is
// seen from then on, so no copy of the command runs in this process.
func (j *Journal) Refuse(id string, expires time.Time, update []byte) (bool, error) {
	return j.appendIfNew(Entry{Op: "done", ID: id, ExpiresMS: expires.UnixMilli(), Update: update}, true)
}

// Done records id's final signed update (also for a refusal, which makes
// the id seen); the entry is fsynced before Done returns, so the update
// survives a crash. One that cannot be written is kept in memory (an error
// wrapping ErrNotDurable) and written by the next write that succeeds.
func (j *Journal) Done(id string, expires time.Time, update []byte) error {
	return j.append(Entry{Op: "done", ID: id, ExpiresMS: expires.UnixMilli(), Update: update}, true, true)
}

// Ack records that the gateway stored id's final update. The entry is
// written but not fsynced: a crash that loses it only makes the node send
// the final update again, which the control plane acknowledges again
// without changing anything (see the package comment).
func (j *Journal) Ack(id string) error {
	j.mu.Lock()
	r := j.records[id]
	j.mu.Unlock()
	if r == nil || r.Acked {
		return nil
	}
	return j.append(Entry{Op: "ack", ID: id}, false, true)
}

// Interrupted returns the commands that started but never finished.
func (j *Journal) Interrupted() []Record {
	return j.filter(func(r *Record) bool { return r.Started && !r.Done })
}

// Unacked returns finished commands whose update the gateway has not
// acknowledged, in the order they finished (Seq).
func (j *Journal) Unacked() []Record {
	out := j.filter(func(r *Record) bool { return r.Done && !r.Acked })
	sort.SliceStable(out, func(a, b int) bool { return out[a].Seq < out[b].Seq })
	return out
}

func (j *Journal) filter(keep func(*Record) bool) []Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []Record
	for _, r := range j.records {
		if keep(r) {
			out = append(out, *r)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// Close releases the journal; it holds no open file, so it cannot fail.
func (j *Journal) Close() error { return nil }
