package auditlog

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strconv"
	"strings"

	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"
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
}

// Verify recomputes the tenant's log from its rows and checks every stored
// checkpoint: its signature under v (whose name must be
// "<deployment>/audit"), its origin, size and root, and its consistency with
// its predecessor. It names each problem (see the Finding kinds). progress,
// when not nil, is called now and then with rows read and the log's size.
// Its error is for failures to read; tampering is reported as findings.
func (l *Log) Verify(ctx context.Context, tenant string, v note.Verifier, progress func(done, total int64)) (*Report, error) {
	rep := &Report{Tenant: tenant, Origin: v.Name() + "/" + tenant, Findings: []Finding{}}
	add := func(f Finding) { rep.Findings = append(rep.Findings, f) }

	var stateSize int64
	err := l.db.QueryRowContext(ctx, `SELECT size FROM audit_log_state WHERE tenant_id = $1`, tenant).Scan(&stateSize)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("auditlog: read log state: %w", err)
	}
	cps, err := l.readCheckpoints(ctx, tenant)
	if err != nil {
		return nil, err
	}

	// Checkpoints: chain, signature, origin, size, consistency.
	var good []trusted
	var prevRow int64
	for _, c := range cps {
		switch {
		case c.prev > prevRow:
			add(Finding{Kind: FindingCheckpointMissing, Size: i64(c.prev), Detail: fmt.Sprintf("the checkpoint of size %d names it as its predecessor", c.size)})
		case c.prev != prevRow:
			add(Finding{Kind: FindingCheckpointEdited, Size: i64(c.size), Detail: fmt.Sprintf("predecessor %d, want %d", c.prev, prevRow)})
		}
		prevRow = c.size
		cp, err := OpenCheckpoint(c.note, v, rep.Origin)
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
		if n := len(good); n > 0 && good[n-1].size == uint64(c.prev) {
			hs, ok := splitHashes(c.cons)
			if !ok {
				add(Finding{Kind: FindingCheckpointInconsistent, Size: i64(c.size), Detail: "stored consistency proof is malformed"})
			} else if err := proof.VerifyConsistency(rfc6962.DefaultHasher, good[n-1].size, cp.Size, hs, good[n-1].root, cp.Root); err != nil {
				add(Finding{Kind: FindingCheckpointInconsistent, Size: i64(c.size), Detail: fmt.Sprintf("from size %d: %v", c.prev, err)})
			}
		}
		good = append(good, trusted{size: cp.Size, root: cp.Root})
	}
	rep.Checkpoints = len(good)
	switch {
	case stateSize > prevRow:
		add(Finding{Kind: FindingCheckpointMissing, Size: i64(stateSize), Detail: "the log's size has no checkpoint"})
	case stateSize < prevRow:
		add(Finding{Kind: FindingStateEdited, Size: i64(stateSize), Detail: fmt.Sprintf("the log's size is below its last checkpoint's %d", prevRow)})
		stateSize = prevRow
	}
	rep.Size = stateSize

	// Rows, in seq order, against every trusted root.
	acc := &rowAcc{inserted: map[string]Row{}, deleted: map[string]leaf{}}
	cur := l.rf.NewEmptyRange(0)
	var lo uint64 // start of the current segment
	ti := 0       // next trusted checkpoint
	closeSegment := func() error {
		t := good[ti]
		ti++
		root, err := cur.GetRootHash(nil)
		if err != nil {
			return fmt.Errorf("auditlog: root: %w", err)
		}
		if cur.End() == t.size && bytes.Equal(root, t.root) {
			lo = t.size
			return nil
		}
		n, err := l.localise(ctx, tenant, int64(lo), int64(t.size), acc)
		if err != nil {
			return err
		}
		// Continue from the stored tree at this size when it is the signed
		// one, so that later segments are checked on their own.
		next, serr := l.storedRange(ctx, l.db, tenant, t.size)
		nextOK := serr == nil
		if nextOK {
			r, err := next.GetRootHash(nil)
			nextOK = err == nil && bytes.Equal(r, t.root)
		}
		if n == 0 || !nextOK {
			acc.out = append(acc.out, Finding{Kind: FindingRootMismatch, Size: i64(int64(t.size)),
				Detail: fmt.Sprintf("rows %d..%d and the stored tree do not hash to the signed root", lo, t.size-1)})
		}
		if nextOK {
			cur = next
		} else {
			// Keep positions aligned with a placeholder tree; roots beyond
			// this point cannot match and are reported in turn.
			zeros := make([][]byte, bits.OnesCount64(t.size))
			for i := range zeros {
				zeros[i] = make([]byte, HashSize)
			}
			if cur, err = l.rf.NewRange(0, t.size, zeros); err != nil {
				return fmt.Errorf("auditlog: placeholder range: %w", err)
			}
		}
		lo = t.size
		return nil
	}

	// Rows are read in pages (keyset on seq) so that no cursor stays open
	// while a mismatching segment is localised: SQLite has one connection.
	buf := make([]byte, 0, 512)
	var tail bool // rows past the last trusted checkpoint
	next := int64(math.MinInt64)
	for {
		page, err := scanRows(l.db.QueryContext(ctx, `SELECT `+rowCols+` FROM audit_events WHERE tenant_id = $1 AND seq IS NOT NULL AND seq >= $2 ORDER BY seq LIMIT $3`, tenant, next, verifyPage))
		if err != nil {
			return nil, fmt.Errorf("auditlog: read rows: %w", err)
		}
		// A full page ends before its last seq, which the next page starts
		// with, so that rows sharing a seq (possible only if the unique
		// index was dropped) are neither skipped nor read twice.
		full := len(page) == verifyPage
		if full {
			last := page[len(page)-1].Seq
			cut := len(page)
			for cut > 0 && page[cut-1].Seq == last {
				cut--
			}
			if cut == 0 {
				return nil, fmt.Errorf("%w: more than %d rows share seq %d", ErrTampered, verifyPage, last)
			}
			page, next = page[:cut], last
		}
		for _, r := range page {
			rep.Rows++
			if progress != nil && rep.Rows&0xffff == 0 {
				progress(rep.Rows, stateSize)
			}
			for ti < len(good) && uint64(r.Seq) >= good[ti].size {
				if err := closeSegment(); err != nil {
					return nil, err
				}
			}
			if ti == len(good) {
				tail = true
				continue
			}
			buf = AppendRow(buf[:0], r)
			if err := cur.Append(rfc6962.DefaultHasher.HashLeaf(buf), nil); err != nil {
				return nil, fmt.Errorf("auditlog: append: %w", err)
			}
		}
		if !full {
			break
		}
	}
	for ti < len(good) {
		if err := closeSegment(); err != nil {
			return nil, err
		}
	}
	if progress != nil {
		progress(rep.Rows, stateSize)
	}
	// Rows past the last verified checkpoint are checked against the stored
	// leaves (a checkpoint is missing or refused, reported above) and rows
	// numbered past the log's size were never sealed.
	if tail || uint64(stateSize) > lo {
		if _, err := l.localise(ctx, tenant, int64(lo), math.MaxInt64, acc); err != nil {
			return nil, err
		}
	}
	rep.Findings = append(rep.Findings, acc.merge()...)
	return rep, nil
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
}

func (a *rowAcc) merge() []Finding {
	out := a.out
	for ev, r := range a.inserted {
		lf, ok := a.deleted[ev]
		if !ok {
			out = append(out, Finding{Kind: FindingRowInserted, Seq: i64(r.Seq), Event: ev, Detail: "no sealed leaf has this event"})
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
func (l *Log) localise(ctx context.Context, tenant string, lo, hi int64, acc *rowAcc) (int, error) {
	rs, err := scanRows(l.db.QueryContext(ctx, `SELECT `+rowCols+` FROM audit_events WHERE tenant_id = $1 AND seq >= $2 AND seq < $3 ORDER BY seq`, tenant, lo, hi))
	if err != nil {
		return 0, fmt.Errorf("auditlog: read rows: %w", err)
	}
	stored := map[string]leaf{}
	rows, err := l.db.QueryContext(ctx, `SELECT idx, hash, event_id FROM audit_log_nodes WHERE tenant_id = $1 AND level = 0 AND idx >= $2 AND idx < $3`, tenant, lo, hi)
	if err != nil {
		return 0, fmt.Errorf("auditlog: read leaves: %w", err)
	}
	for rows.Next() {
		var lf leaf
		var ev string
		if err := rows.Scan(&lf.idx, &lf.hash, &ev); err != nil {
			rows.Close()
			return 0, fmt.Errorf("auditlog: read leaves: %w", err)
		}
		stored[ev] = lf
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("auditlog: read leaves: %w", err)
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

func (l *Log) readCheckpoints(ctx context.Context, tenant string) ([]storedCheckpoint, error) {
	rows, err := l.db.QueryContext(ctx, `SELECT size, prev_size, note, consistency FROM audit_checkpoints WHERE tenant_id = $1 ORDER BY size`, tenant)
	if err != nil {
		return nil, fmt.Errorf("auditlog: read checkpoints: %w", err)
	}
	defer rows.Close()
	var out []storedCheckpoint
	for rows.Next() {
		var c storedCheckpoint
		if err := rows.Scan(&c.size, &c.prev, &c.note, &c.cons); err != nil {
			return nil, fmt.Errorf("auditlog: read checkpoints: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
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
