package auditlog

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"

	"github.com/bettercompute/bettercompute/internal/audit"
)

// verifyPage is how many rows Verify reads per query.
const verifyPage = 20_000

// Finding kinds reported by Verify (docs/audit.md lists what each means).
const (
	FindingRowEdited              = "row-edited"
	FindingRowDeleted             = "row-deleted"
	FindingRowInserted            = "row-inserted"
	FindingCheckpointMissing      = "checkpoint-missing"
	FindingCheckpointEdited       = ReasonEdited
	FindingCheckpointBadSignature = ReasonBadSignature
	FindingCheckpointInconsistent = "checkpoint-inconsistent"
	FindingRootMismatch           = "root-mismatch"
	FindingStateEdited            = "log-state-edited"
	// FindingCheckpointForked: a checkpoint the verifier held from before
	// (Held) has another root than the log's checkpoint of its size: the
	// log was rolled back and sealed again, a fork signed by the real key
	// that nothing inside the database shows.
	FindingCheckpointForked = "checkpoint-forked"
	// FindingLogRolledBack: the log is shorter than a checkpoint the
	// verifier held from before.
	FindingLogRolledBack = "log-rolled-back"
)

// Finding is one thing Verify found wrong. Seq names a row position, Size a
// checkpoint.
type Finding struct {
	Kind   string `json:"kind"`
	Seq    *int64 `json:"seq,omitempty"`
	Size   *int64 `json:"size,omitempty"`
	Event  string `json:"event,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// String renders a finding on one line: "row-edited seq=17 event=ev_…".
func (f Finding) String() string {
	var sb strings.Builder
	sb.WriteString(f.Kind)
	if f.Seq != nil {
		sb.WriteString(" seq=" + strconv.FormatInt(*f.Seq, 10))
	}
	if f.Size != nil {
		sb.WriteString(" size=" + strconv.FormatInt(*f.Size, 10))
	}
	if f.Event != "" {
		sb.WriteString(" event=" + f.Event)
	}
	if f.Detail != "" {
		sb.WriteString(" (" + f.Detail + ")")
	}
	return sb.String()
}

func i64(v int64) *int64 { return &v }

// Report is the outcome of Verify. OK() is true only when there are no
// findings.
type Report struct {
	Tenant      string    `json:"tenant"`
	Origin      string    `json:"origin"`
	Size        int64     `json:"size"`        // the log's size per its state
	Checkpoints int       `json:"checkpoints"` // checkpoints that verified
	Rows        int64     `json:"rows"`        // sealed rows read
	Findings    []Finding `json:"findings"`
	// Latest is the signed note of the last checkpoint that verified (nil
	// when none did): what a verifier keeps and holds against the log
	// next time (Held), since nothing inside the database can show that
	// the log was rolled back and sealed again.
	Latest []byte `json:"-"`
}

// OK reports whether everything held.
func (r *Report) OK() bool { return len(r.Findings) == 0 }

type storedCheckpoint struct {
	size, prev int64
	note, cons []byte
}

type trusted struct {
	size uint64
	root []byte
	note []byte
}

// Verify recomputes the tenant's log from its rows and checks every stored
// checkpoint: its signature under v (whose name must be
// "<deployment>/audit"), its origin, size and root, and its consistency with
// its predecessor. It names each problem (see the Finding kinds). progress,
// when not nil, is called now and then with rows read and the log's size.
// Its error is for failures to read; tampering is reported as findings.
func (l *Log) Verify(ctx context.Context, tenant string, v note.Verifier, progress func(done, total int64)) (*Report, error) {
	return l.VerifyHeld(ctx, tenant, v, nil, progress)
}

// VerifyHeld is Verify that also checks the log against checkpoints the
// verifier held from before (each already opened under v for this
// tenant's origin: OpenCheckpoint, or a proof's, CheckProof): the log's
// checkpoint of a held one's size must have its root
// (FindingCheckpointForked), and the log must be no shorter
// (FindingLogRolledBack).
//
// Every read is made in one snapshot (store.DB.ReadTx): rows a seal
// numbers while it runs are neither seen nor taken for tampering.
func (l *Log) VerifyHeld(ctx context.Context, tenant string, v note.Verifier, held []Checkpoint, progress func(done, total int64)) (*Report, error) {
	var rep *Report
	err := l.db.ReadTx(ctx, func(tx *sql.Tx) error {
		var err error
		rep, err = l.verifyIn(ctx, tx, tenant, v, held, progress)
		return err
	})
	if err != nil {
		return nil, err
	}
	return rep, nil
}

// verifyIn is VerifyHeld with every read made through q.
func (l *Log) verifyIn(ctx context.Context, q audit.Querier, tenant string, v note.Verifier, held []Checkpoint, progress func(done, total int64)) (*Report, error) {
	rep := &Report{Tenant: tenant, Origin: v.Name() + "/" + tenant, Findings: []Finding{}}
	stateSize, err := l.stateSize(ctx, q, tenant)
	if err != nil {
		return nil, err
	}
	cps, err := l.readCheckpoints(ctx, q, tenant)
	if err != nil {
		return nil, err
	}
	chain := checkCheckpoints(cps, v, rep.Origin)
	rep.Findings = append(rep.Findings, chain.findings...)
	rep.Checkpoints = len(chain.good)
	var f []Finding
	rep.Size, f = checkStateSize(stateSize, chain.last)
	rep.Findings = append(rep.Findings, f...)
	rep.Findings = append(rep.Findings, checkHeld(held, chain.good, rep.Size)...)
	if n := len(chain.good); n > 0 {
		rep.Latest = chain.good[n-1].note
	}

	// Rows, in seq order, against every trusted root.
	w := &rowWalk{l: l, q: q, tenant: tenant, good: chain.good, cur: l.rf.NewEmptyRange(0),
		acc: &rowAcc{inserted: map[string]Row{}, deleted: map[string]leaf{}, size: rep.Size}, buf: make([]byte, 0, 512)}
	if err := w.walk(ctx, rep, progress); err != nil {
		return nil, err
	}
	rep.Findings = append(rep.Findings, w.acc.merge()...)
	return rep, nil
}

// chainCheck is what checkCheckpoints found: the checkpoints that verified
// (trusted roots, in size order), the size of the last stored checkpoint
// and the findings.
type chainCheck struct {
	good     []trusted
	last     int64
	findings []Finding
}

// checkCheckpoints checks the stored checkpoints (in size order) with no
// reads: each names its predecessor, verifies under v for origin, is
// signed for its stored size, and is consistent with the previous trusted
// checkpoint when that is its predecessor.
func checkCheckpoints(cps []storedCheckpoint, v note.Verifier, origin string) chainCheck {
	var out chainCheck
	add := func(f Finding) { out.findings = append(out.findings, f) }
	for _, c := range cps {
		switch {
		case c.prev > out.last:
			add(Finding{Kind: FindingCheckpointMissing, Size: i64(c.prev), Detail: fmt.Sprintf("the checkpoint of size %d names it as its predecessor", c.size)})
		case c.prev != out.last:
			add(Finding{Kind: FindingCheckpointEdited, Size: i64(c.size), Detail: fmt.Sprintf("predecessor %d, want %d", c.prev, out.last)})
		}
		out.last = c.size
		cp, err := OpenCheckpoint(c.note, v, origin)
		if err != nil {
			reason := FindingCheckpointEdited
			if ce, ok := err.(*CheckpointError); ok {
				reason = ce.Reason
			}
			add(Finding{Kind: reason, Size: i64(c.size), Detail: err.Error()})
			continue
		}
		if cp.Size != uint64(c.size) {
			add(Finding{Kind: FindingCheckpointEdited, Size: i64(c.size), Detail: fmt.Sprintf("stored as size %d but signed for size %d", c.size, cp.Size)})
			continue
		}
		if n := len(out.good); n > 0 && out.good[n-1].size == uint64(c.prev) {
			if f, ok := checkConsistency(c, out.good[n-1], cp); !ok {
				add(f)
			}
		}
		out.good = append(out.good, trusted{size: cp.Size, root: cp.Root, note: c.note})
	}
	return out
}

// checkHeld compares checkpoints held from before with the log's that
// verified (good) and its size: one of a held size with another root is a
// fork; a held size past the log's is a rollback; a held size the log has
// no verified checkpoint of is missing.
func checkHeld(held []Checkpoint, good []trusted, size int64) []Finding {
	var out []Finding
	for _, h := range held {
		i := slices.IndexFunc(good, func(t trusted) bool { return t.size == h.Size })
		switch {
		case i >= 0 && !bytes.Equal(good[i].root, h.Root):
			out = append(out, Finding{Kind: FindingCheckpointForked, Size: i64(int64(h.Size)), Detail: "the log's checkpoint of this size has another root than the one held: rolled back and sealed again"})
		case i < 0 && int64(h.Size) > size:
			out = append(out, Finding{Kind: FindingLogRolledBack, Size: i64(int64(h.Size)), Detail: fmt.Sprintf("the log's size %d is below a checkpoint held", size)})
		case i < 0:
			out = append(out, Finding{Kind: FindingCheckpointMissing, Size: i64(int64(h.Size)), Detail: "a checkpoint held has no verified checkpoint of its size in the log"})
		}
	}
	return out
}

// checkConsistency checks c's stored consistency proof from prev to cp.
func checkConsistency(c storedCheckpoint, prev trusted, cp Checkpoint) (Finding, bool) {
	hs, ok := splitHashes(c.cons)
	if !ok {
		return Finding{Kind: FindingCheckpointInconsistent, Size: i64(c.size), Detail: "stored consistency proof is malformed"}, false
	}
	if err := proof.VerifyConsistency(rfc6962.DefaultHasher, prev.size, cp.Size, hs, prev.root, cp.Root); err != nil {
		return Finding{Kind: FindingCheckpointInconsistent, Size: i64(c.size), Detail: fmt.Sprintf("from size %d: %v", c.prev, err)}, false
	}
	return Finding{}, true
}

// checkStateSize compares the log's size per its state with its last
// checkpoint's: a size past it has no checkpoint, a size below it was
// edited (and the checkpoint's is used). It returns the size to verify
// to.
func checkStateSize(stateSize, last int64) (int64, []Finding) {
	switch {
	case stateSize > last:
		return stateSize, []Finding{{Kind: FindingCheckpointMissing, Size: i64(stateSize), Detail: "the log's size has no checkpoint"}}
	case stateSize < last:
		return last, []Finding{{Kind: FindingStateEdited, Size: i64(stateSize), Detail: fmt.Sprintf("the log's size is below its last checkpoint's %d", last)}}
	}
	return stateSize, nil
}

// rowWalk recomputes the log from its rows in seq order, closing a
// segment at each trusted checkpoint and localising a segment whose root
// does not match.
type rowWalk struct {
	l      *Log
	q      audit.Querier // the snapshot every read is made in
	tenant string
	good   []trusted      // trusted checkpoints, in size order
	ti     int            // next trusted checkpoint
	cur    *compact.Range // the tree so far
	lo     uint64         // start of the current segment
	acc    *rowAcc
	buf    []byte
}

// walk reads every numbered row in pages (keyset on seq), so that no
// cursor stays open while a mismatching segment is localised (SQLite has
// one connection), closes the remaining segments, and checks the rows
// past the last trusted checkpoint.
func (w *rowWalk) walk(ctx context.Context, rep *Report, progress func(done, total int64)) error {
	next := int64(math.MinInt64)
	for {
		page, err := audit.RowsFrom(ctx, w.q, w.tenant, next, verifyPage)
		if err != nil {
			return fmt.Errorf("auditlog: read rows: %w", err)
		}
		page, nextFrom, full, err := cutPage(page, verifyPage)
		if err != nil {
			return err
		}
		for _, r := range page {
			rep.Rows++
			if progress != nil && rep.Rows&0xffff == 0 {
				progress(rep.Rows, rep.Size)
			}
			if err := w.add(ctx, r); err != nil {
				return err
			}
		}
		if !full {
			break
		}
		next = nextFrom
	}
	for w.ti < len(w.good) {
		if err := w.closeSegment(ctx); err != nil {
			return err
		}
	}
	if progress != nil {
		progress(rep.Rows, rep.Size)
	}
	// Rows past the last verified checkpoint and below the log's size are
	// checked against the stored leaves (a checkpoint is missing or
	// refused, reported above).
	if uint64(rep.Size) > w.lo {
		if _, err := w.l.localise(ctx, w.q, w.tenant, int64(w.lo), rep.Size, w.acc); err != nil {
			return err
		}
	}
	// A row numbered at or past the log's size was appended by no seal
	// (a seal numbers its rows and signs their checkpoint in one
	// transaction), whatever leaves the tables hold for it: stored leaves
	// are the database's word, and its writer could forge them too.
	past, err := audit.RowsBetween(ctx, w.q, w.tenant, rep.Size, math.MaxInt64, 0)
	if err != nil {
		return fmt.Errorf("auditlog: read rows: %w", err)
	}
	for _, r := range past {
		w.acc.inserted[r.ID] = r
	}
	return nil
}

// cutPage trims a page of rows read with a limit of size: a full page ends
// before its last seq, which the next page starts with (next), so that
// rows sharing a seq (possible only if the unique index was dropped) are
// neither skipped nor read twice. More than size rows sharing one seq is
// ErrTampered.
func cutPage(page []Row, size int) (out []Row, next int64, full bool, err error) {
	if len(page) != size {
		return page, 0, false, nil
	}
	last := page[len(page)-1].Seq
	cut := len(page)
	for cut > 0 && page[cut-1].Seq == last {
		cut--
	}
	if cut == 0 {
		return nil, 0, false, fmt.Errorf("%w: more than %d rows share seq %d", ErrTampered, size, last)
	}
	return page[:cut], last, true, nil
}

// add appends row r to the tree, first closing every segment that ends at
// or before it; a row past the last trusted checkpoint is checked after
// the walk (walk's tail checks).
func (w *rowWalk) add(ctx context.Context, r Row) error {
	for w.ti < len(w.good) && uint64(r.Seq) >= w.good[w.ti].size {
		if err := w.closeSegment(ctx); err != nil {
			return err
		}
	}
	if w.ti == len(w.good) {
		return nil
	}
	w.buf = AppendRow(w.buf[:0], r)
	if err := w.cur.Append(rfc6962.DefaultHasher.HashLeaf(w.buf), nil); err != nil {
		return fmt.Errorf("auditlog: append: %w", err)
	}
	return nil
}

// closeSegment checks the tree so far against the next trusted
// checkpoint; on a mismatch it localises the segment's rows and goes on
// from the stored tree at the checkpoint's size when that is the signed
// one, else from a placeholder.
func (w *rowWalk) closeSegment(ctx context.Context) error {
	t := w.good[w.ti]
	w.ti++
	root, err := w.cur.GetRootHash(nil)
	if err != nil {
		return fmt.Errorf("auditlog: root: %w", err)
	}
	if w.cur.End() == t.size && bytes.Equal(root, t.root) {
		w.lo = t.size
		return nil
	}
	n, err := w.l.localise(ctx, w.q, w.tenant, int64(w.lo), int64(t.size), w.acc)
	if err != nil {
		return err
	}
	// Continue from the stored tree at this size when it is the signed
	// one, so that later segments are checked on their own.
	next, nextOK := w.signedStoredRange(ctx, t)
	if n == 0 || !nextOK {
		w.acc.out = append(w.acc.out, Finding{Kind: FindingRootMismatch, Size: i64(int64(t.size)),
			Detail: fmt.Sprintf("rows %d..%d and the stored tree do not hash to the signed root", w.lo, t.size-1)})
	}
	if nextOK {
		w.cur = next
	} else if w.cur, err = w.l.placeholderRange(t.size); err != nil {
		return err
	}
	w.lo = t.size
	return nil
}

// signedStoredRange loads the stored tree at t's size and reports whether
// it hashes to t's signed root.
func (w *rowWalk) signedStoredRange(ctx context.Context, t trusted) (*compact.Range, bool) {
	next, err := w.l.storedRange(ctx, w.q, w.tenant, t.size)
	if err != nil {
		return nil, false
	}
	r, err := next.GetRootHash(nil)
	return next, err == nil && bytes.Equal(r, t.root)
}

// placeholderRange keeps positions aligned with a tree of zero hashes of
// size; roots beyond this point cannot match and are reported in turn.
func (l *Log) placeholderRange(size uint64) (*compact.Range, error) {
	zeros := make([][]byte, bits.OnesCount64(size))
	for i := range zeros {
		zeros[i] = make([]byte, HashSize)
	}
	r, err := l.rf.NewRange(0, size, zeros)
	if err != nil {
		return nil, fmt.Errorf("auditlog: placeholder range: %w", err)
	}
	return r, nil
}

type leaf struct {
	idx  int64
	hash []byte
}

// rowAcc collects the row findings of every localised range. A row missing
// from its position and found at another (renumbered across a checkpoint)
// is first seen as deleted and inserted; merge pairs them by event id.
type rowAcc struct {
	out      []Finding
	inserted map[string]Row
	deleted  map[string]leaf
	size     int64 // the log's size: a row numbered past it was never sealed
}

func (a *rowAcc) merge() []Finding {
	out := a.out
	for ev, r := range a.inserted {
		lf, ok := a.deleted[ev]
		if !ok {
			detail := "no sealed leaf has this event"
			if r.Seq >= a.size {
				detail = fmt.Sprintf("numbered past the log's size %d", a.size)
			}
			out = append(out, Finding{Kind: FindingRowInserted, Seq: i64(r.Seq), Event: ev, Detail: detail})
			continue
		}
		delete(a.deleted, ev)
		at := r
		at.Seq = lf.idx
		f := Finding{Kind: FindingRowEdited, Seq: i64(lf.idx), Event: ev}
		if bytes.Equal(LeafHash(at), lf.hash) {
			f.Detail = fmt.Sprintf("renumbered to %d", r.Seq)
		}
		out = append(out, f)
	}
	for ev, lf := range a.deleted {
		out = append(out, Finding{Kind: FindingRowDeleted, Seq: i64(lf.idx), Event: ev})
	}
	key := func(f Finding) int64 {
		if f.Seq != nil {
			return *f.Seq
		}
		return *f.Size - 1
	}
	sort.SliceStable(out, func(i, j int) bool {
		if ki, kj := key(out[i]), key(out[j]); ki != kj {
			return ki < kj
		}
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Event < out[j].Event
	})
	return out
}

// localise compares the rows in [lo, hi) with the stored leaves, by event
// id: a row whose event has no stored leaf is inserted, a stored leaf whose
// event has no row is deleted, and a row whose leaf (at its stored position)
// differs is edited. It returns how many differences it found.
func (l *Log) localise(ctx context.Context, q audit.Querier, tenant string, lo, hi int64, acc *rowAcc) (int, error) {
	rs, err := audit.RowsBetween(ctx, q, tenant, lo, hi, 0)
	if err != nil {
		return 0, fmt.Errorf("auditlog: read rows: %w", err)
	}
	stored, err := l.readLeaves(ctx, q, tenant, lo, hi)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range rs {
		lf, ok := stored[r.ID]
		if !ok {
			acc.inserted[r.ID] = r
			n++
			continue
		}
		delete(stored, r.ID)
		at := r
		at.Seq = lf.idx
		switch {
		case !bytes.Equal(LeafHash(at), lf.hash):
			acc.out = append(acc.out, Finding{Kind: FindingRowEdited, Seq: i64(lf.idx), Event: r.ID})
			n++
		case r.Seq != lf.idx:
			acc.out = append(acc.out, Finding{Kind: FindingRowEdited, Seq: i64(lf.idx), Event: r.ID, Detail: fmt.Sprintf("renumbered to %d", r.Seq)})
			n++
		}
	}
	for ev, lf := range stored {
		acc.deleted[ev] = lf
		n++
	}
	return n, nil
}

func splitHashes(b []byte) ([][]byte, bool) {
	if len(b)%HashSize != 0 {
		return nil, false
	}
	out := make([][]byte, 0, len(b)/HashSize)
	for i := 0; i < len(b); i += HashSize {
		out = append(out, b[i:i+HashSize])
	}
	return out, true
}
