package auditlog

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/rfc6962"
	"gocloud.dev/blob"
	"golang.org/x/mod/sumdb/note"
)

// Finding kinds reported by VerifySink, beside Verify's checkpoint kinds
// (bad signature, edited, root mismatch, forked), which mean the same on a
// sink.
const (
	// FindingSinkRowMissing: the sink has no row at a seq that a later row
	// or a checkpoint needs; nothing past it is checked.
	FindingSinkRowMissing = "sink-row-missing"
	// FindingSinkRowConflict: the sink holds two different rows at one seq.
	FindingSinkRowConflict = "sink-row-conflict"
	// FindingSinkLeafMismatch: a row's content no longer hashes to the leaf
	// copied with it (the row was changed in the sink).
	FindingSinkLeafMismatch = "sink-leaf-mismatch"
	// FindingSinkRowMisplaced: a bucket object holds another tenant's row,
	// or another seq, than its key names.
	FindingSinkRowMisplaced = "sink-row-misplaced"
)

// SinkContents is what a sink holds, by tenant: what ReadSink returns and
// VerifySink checks. Nothing in it is trusted until verified.
type SinkContents struct {
	Rows        map[string][]Record         // by tenant, in the order read
	Checkpoints map[string][]SinkCheckpoint // by tenant, in the order read
	// Misplaced names bucket objects whose content is not what their key
	// says (tenant and seq, or tenant and size), by tenant of the key.
	Misplaced map[string][]string
	// Unreadable counts lines or objects that did not parse: a file's line
	// cut short by a crash is one; more than that is worth a look.
	Unreadable int
}

func newSinkContents() *SinkContents {
	return &SinkContents{Rows: map[string][]Record{}, Checkpoints: map[string][]SinkCheckpoint{}, Misplaced: map[string][]string{}}
}

// Tenants lists the tenants the sink holds anything of, sorted.
func (c *SinkContents) Tenants() []string {
	seen := map[string]bool{}
	for t := range c.Rows {
		seen[t] = true
	}
	for t := range c.Checkpoints {
		seen[t] = true
	}
	for t := range c.Misplaced {
		seen[t] = true
	}
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// sinkLine is one JSON line of a file sink: a Record, or a SinkCheckpoint
// (which alone has "checkpoint").
type sinkLine struct {
	Record
	Size       int64   `json:"size"`
	Checkpoint *string `json:"checkpoint"`
}

// ReadSink reads everything a sink holds, by the spec serve --audit-sink
// takes (a plain path: the JSON-lines file; a bucket URL: its objects).
func ReadSink(ctx context.Context, spec string) (*SinkContents, error) {
	if strings.Contains(spec, "://") {
		return readBlobSink(ctx, spec)
	}
	f, err := os.Open(spec)
	if err != nil {
		return nil, fmt.Errorf("auditlog: open sink file: %w", err)
	}
	defer f.Close()
	return readFileSink(f)
}

// maxSinkLine bounds one line of a sink file: a row is at most a few KiB.
const maxSinkLine = 4 << 20

func readFileSink(r io.Reader) (*SinkContents, error) {
	out := newSinkContents()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxSinkLine)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var l sinkLine
		switch {
		case json.Unmarshal(sc.Bytes(), &l) != nil:
			out.Unreadable++
		case l.Checkpoint != nil:
			out.Checkpoints[l.Record.TenantID] = append(out.Checkpoints[l.Record.TenantID], SinkCheckpoint{TenantID: l.Record.TenantID, Size: l.Size, Note: *l.Checkpoint})
		case l.ID != "":
			out.Rows[l.Record.TenantID] = append(out.Rows[l.Record.TenantID], l.Record)
		default:
			out.Unreadable++
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auditlog: read sink file: %w", err)
	}
	return out, nil
}

func readBlobSink(ctx context.Context, spec string) (*SinkContents, error) {
	b, err := blob.OpenBucket(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("auditlog: open sink bucket: %w", err)
	}
	defer b.Close()
	out := newSinkContents()
	it := b.List(nil)
	for {
		o, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("auditlog: list sink bucket: %w", err)
		}
		tenant, kind, n, ok := parseSinkKey(o.Key)
		if !ok {
			out.Unreadable++
			continue
		}
		data, err := b.ReadAll(ctx, o.Key)
		if err != nil {
			return nil, fmt.Errorf("auditlog: read sink object %s: %w", o.Key, err)
		}
		switch kind {
		case "row":
			var r Record
			if json.Unmarshal(data, &r) != nil || r.ID == "" {
				out.Unreadable++
				continue
			}
			if r.TenantID != tenant || r.Seq != n {
				out.Misplaced[tenant] = append(out.Misplaced[tenant], o.Key)
				continue
			}
			out.Rows[tenant] = append(out.Rows[tenant], r)
		case "checkpoint":
			out.Checkpoints[tenant] = append(out.Checkpoints[tenant], SinkCheckpoint{TenantID: tenant, Size: n, Note: string(data)})
		}
	}
}

// parseSinkKey reads a bucket key BlobKey or CheckpointKey wrote.
func parseSinkKey(key string) (tenant, kind string, n int64, ok bool) {
	esc, rest, found := strings.Cut(key, "/")
	if !found {
		return "", "", 0, false
	}
	tenant, err := url.PathUnescape(esc)
	if err != nil || url.PathEscape(tenant) != esc {
		return "", "", 0, false
	}
	kind, num := "row", strings.TrimSuffix(rest, ".json")
	if c, isCheckpoint := strings.CutPrefix(rest, "checkpoints/"); isCheckpoint {
		kind, num = "checkpoint", strings.TrimSuffix(c, ".note")
	}
	if len(num) != 20 || num == rest {
		return "", "", 0, false
	}
	n, err = strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return "", "", 0, false
	}
	return tenant, kind, n, true
}

// SinkReport is VerifySink's outcome for one tenant.
type SinkReport struct {
	Tenant      string    `json:"tenant"`
	Origin      string    `json:"origin"`
	Rows        int64     `json:"rows"`        // rows held from seq 0 on, without a gap
	Checkpoints int       `json:"checkpoints"` // checkpoints whose signature and root held
	Covered     int64     `json:"covered"`     // rows under the last of them
	Findings    []Finding `json:"findings"`
	// Held are the checkpoints whose signature held, for Verify's held
	// checkpoints (VerifyHeld): what the sink saw of the database's log.
	Held []Checkpoint `json:"-"`
}

// OK reports whether everything held.
func (r *SinkReport) OK() bool { return len(r.Findings) == 0 }

// VerifySink checks what a sink holds of tenant without the database:
// every row from seq 0 on is present once and hashes to the leaf copied
// with it; every checkpoint is signed under v (named "<deployment>/audit")
// for the tenant's origin and has the root of the rows it covers; no two
// signed checkpoints of one size differ (a fork). Problems are findings.
func VerifySink(c *SinkContents, tenant string, v note.Verifier) *SinkReport {
	origin := v.Name() + "/" + tenant
	rep := &SinkReport{Tenant: tenant, Origin: origin, Findings: []Finding{}}
	add := func(f Finding) { rep.Findings = append(rep.Findings, f) }
	for _, key := range c.Misplaced[tenant] {
		add(Finding{Kind: FindingSinkRowMisplaced, Detail: key})
	}

	bySeq, gap := sinkRows(c.Rows[tenant], rep, add)
	cps := sinkCheckpoints(c.Checkpoints[tenant], v, origin, rep, add)
	checkRoots(bySeq, cps, gap, rep, add)
	return rep
}

// signedCheckpoint is a sink's checkpoint whose signature held.
type signedCheckpoint struct {
	cp   Checkpoint
	size int64
}

// sinkRows indexes rows by seq, one each, and counts in rep those
// contiguous from 0; gap is true when a later one is missing its
// predecessor.
func sinkRows(rows []Record, rep *SinkReport, add func(Finding)) (bySeq map[int64]Record, gap bool) {
	bySeq = map[int64]Record{}
	for _, r := range rows {
		if prev, dup := bySeq[r.Seq]; dup {
			if !bytes.Equal(EncodeRow(prev.Row), EncodeRow(r.Row)) || !bytes.Equal(prev.Leaf, r.Leaf) {
				add(Finding{Kind: FindingSinkRowConflict, Seq: i64(r.Seq), Event: r.ID})
			}
			continue
		}
		bySeq[r.Seq] = r
	}
	for !gap && int64(len(bySeq)) > rep.Rows {
		if _, ok := bySeq[rep.Rows]; !ok {
			add(Finding{Kind: FindingSinkRowMissing, Seq: i64(rep.Rows)})
			gap = true
			break
		}
		rep.Rows++
	}
	return bySeq, gap
}

// sinkCheckpoints opens each checkpoint under v for origin, once each,
// in size order, adding the good ones to rep.Held; two of one size with
// different roots are a fork.
func sinkCheckpoints(all []SinkCheckpoint, v note.Verifier, origin string, rep *SinkReport, add func(Finding)) []signedCheckpoint {
	var cps []signedCheckpoint
	for _, sc := range all {
		cp, err := OpenCheckpoint([]byte(sc.Note), v, origin)
		if err != nil {
			kind := FindingCheckpointBadSignature
			var ce *CheckpointError
			if errors.As(err, &ce) {
				kind = ce.Reason
			}
			add(Finding{Kind: kind, Size: i64(sc.Size), Detail: err.Error()})
			continue
		}
		if int64(cp.Size) != sc.Size {
			add(Finding{Kind: FindingCheckpointEdited, Size: i64(sc.Size), Detail: fmt.Sprintf("stored as size %d, signed for %d", sc.Size, cp.Size)})
		}
		if slices.ContainsFunc(cps, func(o signedCheckpoint) bool { return o.size == int64(cp.Size) && bytes.Equal(o.cp.Root, cp.Root) }) {
			continue // the same checkpoint copied again
		}
		rep.Held = append(rep.Held, cp)
		cps = append(cps, signedCheckpoint{cp: cp, size: int64(cp.Size)})
	}
	sort.SliceStable(cps, func(i, j int) bool { return cps[i].size < cps[j].size })
	for i := 1; i < len(cps); i++ {
		if cps[i].size == cps[i-1].size && !bytes.Equal(cps[i].cp.Root, cps[i-1].cp.Root) {
			add(Finding{Kind: FindingCheckpointForked, Size: i64(cps[i].size), Detail: "two signed checkpoints of this size with different roots"})
		}
	}
	return cps
}

// checkRoots recomputes the tree over the rows in seq order and compares
// each checkpoint's root at its size, counting in rep those that hold.
func checkRoots(bySeq map[int64]Record, cps []signedCheckpoint, gap bool, rep *SinkReport, add func(Finding)) {
	rng := (&compact.RangeFactory{Hash: rfc6962.DefaultHasher.HashChildren}).NewEmptyRange(0)
	next := 0
	for seq := int64(0); seq <= rep.Rows; seq++ {
		for ; next < len(cps) && cps[next].size == seq; next++ {
			root, err := rng.GetRootHash(nil)
			if err != nil || !bytes.Equal(root, cps[next].cp.Root) {
				add(Finding{Kind: FindingRootMismatch, Size: i64(seq), Detail: "the rows the sink holds do not hash to this checkpoint's root"})
				continue
			}
			rep.Checkpoints++
			rep.Covered = seq
		}
		if seq == rep.Rows {
			break
		}
		r := bySeq[seq]
		leaf := LeafHash(r.Row)
		if !bytes.Equal(leaf, r.Leaf) {
			add(Finding{Kind: FindingSinkLeafMismatch, Seq: i64(seq), Event: r.ID})
		}
		if err := rng.Append(leaf, nil); err != nil {
			add(Finding{Kind: FindingSinkRowMissing, Seq: i64(seq), Detail: err.Error()})
			break
		}
	}
	for ; !gap && next < len(cps); next++ {
		if cps[next].size > rep.Rows {
			add(Finding{Kind: FindingSinkRowMissing, Seq: i64(rep.Rows), Size: i64(cps[next].size), Detail: "a checkpoint covers rows the sink does not hold"})
			break
		}
	}
}
