package auditlog

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// buckets
	_ "gocloud.dev/blob/memblob"  // mem:// buckets (tests)
	_ "gocloud.dev/blob/s3blob"   // s3:// buckets (S3 and S3-compatible stores)

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Record is one audit row as a sink holds it: the row with its tenant and
// seq, and its leaf hash, so that the copy can be checked against a proof or
// a checkpoint without the database.
type Record struct {
	Row
	Leaf []byte `json:"leaf"` // RFC 6962 leaf hash of EncodeRow(Row), base64 in JSON
}

// SinkCheckpoint is a tenant's signed checkpoint as a sink holds it,
// copied after the rows it covers: outside the database, a checkpoint
// lets a verifier check the copied rows offline (VerifySink) and hold the
// database's log against it (a rolled-back or forked log shows).
type SinkCheckpoint struct {
	TenantID string `json:"tenant"`
	Size     int64  `json:"size"`
	Note     string `json:"checkpoint"` // the signed note, as sealed
}

// Sink receives a copy of every sealed audit row, per tenant in seq order,
// and of the checkpoint that covers them, on a store the database's
// operators cannot change.
type Sink interface {
	// Append copies recs: rows of one tenant with consecutive seqs. It
	// returns only once they are durable; on error the pump retries them
	// later, so a sink must not hold a row twice when given it again (see
	// Last).
	Append(ctx context.Context, tenant string, recs []Record) error
	// AppendCheckpoint copies a signed checkpoint whose rows the sink
	// holds; it returns once it is durable. Given one again, a sink may
	// hold it twice (readers take it once).
	AppendCheckpoint(ctx context.Context, c SinkCheckpoint) error
	// Last reports the last record the sink holds, when the sink cannot
	// recognise a repeated record by itself (an append-only file). The pump
	// moves its cursor past it before copying anything, which makes a copy
	// interrupted between Append and the cursor's update exactly-once.
	// Sinks keyed by (tenant, seq), which overwrite a repeat with identical
	// bytes, return ok false.
	Last(ctx context.Context) (tenant string, seq int64, ok bool, err error)
	Close() error
}

// OpenSink opens a sink by URL: a bucket URL of gocloud.dev/blob (s3://,
// file://, mem://; each row one object <tenant>/<seq>.json), or a plain
// path: an append-only JSON-lines file.
func OpenSink(ctx context.Context, spec string) (Sink, error) {
	if strings.Contains(spec, "://") {
		return OpenBlobSink(ctx, spec)
	}
	return OpenFileSink(spec)
}

// FileSink is an append-only JSON-lines file (mode 0600): one Record per
// line, fsynced before Append returns. Only one pump may write a file.
type FileSink struct {
	mu sync.Mutex
	f  *os.File
}

// maxTail bounds how far back Last looks for the last complete record.
const maxTail = 8 << 20

// OpenFileSink opens (or creates, 0600) the file at path for appending. A
// final line cut short by a crash is terminated with a newline, so that
// every later record starts on its own line; readers skip a line that does
// not parse (only such a fragment can).
func OpenFileSink(path string) (*FileSink, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("auditlog: open sink file: %w", err)
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("auditlog: sink file mode: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("auditlog: sink file: %w", err)
	}
	if st.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, st.Size()-1); err != nil {
			f.Close()
			return nil, fmt.Errorf("auditlog: sink file: %w", err)
		}
		if last[0] != '\n' {
			if _, err := f.Write([]byte("\n")); err != nil {
				f.Close()
				return nil, fmt.Errorf("auditlog: sink file: %w", err)
			}
		}
	}
	return &FileSink{f: f}, nil
}

// Append writes recs, one JSON line each, and fsyncs.
func (s *FileSink) Append(_ context.Context, _ string, recs []Record) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("auditlog: encode record: %w", err)
		}
	}
	return s.write(b.Bytes())
}

// AppendCheckpoint writes c as one JSON line and fsyncs.
func (s *FileSink) AppendCheckpoint(_ context.Context, c SinkCheckpoint) error {
	line, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("auditlog: encode checkpoint: %w", err)
	}
	return s.write(append(line, '\n'))
}

// write appends whole lines and fsyncs.
func (s *FileSink) write(lines []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.f.Write(lines); err != nil {
		return fmt.Errorf("auditlog: write sink file: %w", err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("auditlog: sync sink file: %w", err)
	}
	return nil
}

// Last returns the last complete record in the file.
func (s *FileSink) Last(context.Context) (string, int64, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.f.Stat()
	if err != nil {
		return "", 0, false, fmt.Errorf("auditlog: sink file: %w", err)
	}
	n := min(st.Size(), maxTail)
	buf := make([]byte, n)
	if _, err := s.f.ReadAt(buf, st.Size()-n); err != nil && !errors.Is(err, io.EOF) {
		return "", 0, false, fmt.Errorf("auditlog: read sink file: %w", err)
	}
	lines := bytes.Split(bytes.TrimRight(buf, "\n"), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		var r Record
		if json.Unmarshal(lines[i], &r) == nil && r.ID != "" {
			return r.TenantID, r.Seq, true, nil
		}
	}
	return "", 0, false, nil
}

// Close closes the file.
func (s *FileSink) Close() error { return s.f.Close() }

// BlobSink writes each record as one object, <tenant>/<seq, 20 digits>.json,
// in a gocloud.dev/blob bucket. A repeat overwrites an object with the same
// bytes, so it holds each row once; a bucket with object lock (or a
// write-once policy) keeps the operators of the database from changing it.
type BlobSink struct {
	b *blob.Bucket
}

// OpenBlobSink opens the bucket at url (s3://…, file:///…, mem://).
func OpenBlobSink(ctx context.Context, url string) (*BlobSink, error) {
	b, err := blob.OpenBucket(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("auditlog: open sink bucket: %w", err)
	}
	return &BlobSink{b: b}, nil
}

// BlobKey is the object key of one record.
func BlobKey(tenant string, seq int64) string {
	return fmt.Sprintf("%s/%020d.json", url.PathEscape(tenant), seq)
}

// Append writes one object per record, in order.
func (s *BlobSink) Append(ctx context.Context, tenant string, recs []Record) error {
	for _, r := range recs {
		data, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("auditlog: encode record: %w", err)
		}
		if err := s.b.WriteAll(ctx, BlobKey(tenant, r.Seq), data, &blob.WriterOptions{ContentType: "application/json"}); err != nil {
			return fmt.Errorf("auditlog: write sink object: %w", err)
		}
	}
	return nil
}

// CheckpointKey is the object key of one checkpoint: the tenant's
// checkpoints/<size, 20 digits>.note, beside its rows.
func CheckpointKey(tenant string, size int64) string {
	return fmt.Sprintf("%s/checkpoints/%020d.note", url.PathEscape(tenant), size)
}

// AppendCheckpoint writes c's note as one object (CheckpointKey).
func (s *BlobSink) AppendCheckpoint(ctx context.Context, c SinkCheckpoint) error {
	if err := s.b.WriteAll(ctx, CheckpointKey(c.TenantID, c.Size), []byte(c.Note), &blob.WriterOptions{ContentType: "text/plain; charset=utf-8"}); err != nil {
		return fmt.Errorf("auditlog: write sink checkpoint: %w", err)
	}
	return nil
}

// Last returns ok false: a bucket sink recognises a repeat by its key.
func (s *BlobSink) Last(context.Context) (string, int64, bool, error) { return "", 0, false, nil }

// Close closes the bucket.
func (s *BlobSink) Close() error { return s.b.Close() }

// DefaultPumpBatch is how many rows a pump hands a sink at once.
const DefaultPumpBatch = 1000

// Pump copies sealed rows to a sink, per tenant in seq order, and keeps its
// position in audit_sink_cursors under the sink's name. A failed Append
// leaves the cursor where it was, so an outage delays copying and never
// drops or reorders a row. After a run copies a tenant's rows up to its
// log's size it copies the signed checkpoint of that size, so the sink
// holds checkpoints outside the database. Only one pump may run per sink
// name.
type Pump struct {
	db    *store.DB
	sink  Sink
	name  string
	clk   clock.Clock
	log   *slog.Logger
	batch int

	mu      sync.Mutex
	resumed bool
	cpDone  map[string]int64 // the size of the last checkpoint copied, by tenant
}

// NewPump returns a pump that copies to sink, keeping its cursor under name.
func NewPump(db *store.DB, sink Sink, name string, clk clock.Clock, log *slog.Logger) *Pump {
	if clk == nil {
		clk = clock.Real{}
	}
	if log == nil {
		log = slog.Default()
	}
	return &Pump{db: db, sink: sink, name: name, clk: clk, log: log, batch: DefaultPumpBatch, cpDone: map[string]int64{}}
}

// Run copies every sealed row not yet copied and returns how many it copied.
// It stops at the first error; calling it again resumes.
func (p *Pump) Run(ctx context.Context) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.resumed {
		tenant, seq, ok, err := p.sink.Last(ctx)
		if err != nil {
			return 0, fmt.Errorf("auditlog: sink position: %w", err)
		}
		if ok {
			if err := p.advance(ctx, tenant, seq+1, true); err != nil {
				return 0, err
			}
		}
		p.resumed = true
	}
	type logSize struct {
		tenant string
		size   int64
	}
	rows, err := p.db.QueryContext(ctx, qStateSizes)
	if err != nil {
		return 0, fmt.Errorf("auditlog: read logs: %w", err)
	}
	var logs []logSize
	for rows.Next() {
		var l logSize
		if err := rows.Scan(&l.tenant, &l.size); err != nil {
			rows.Close()
			return 0, fmt.Errorf("auditlog: read logs: %w", err)
		}
		logs = append(logs, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("auditlog: read logs: %w", err)
	}
	copied := 0
	for _, l := range logs {
		next, err := p.cursor(ctx, l.tenant)
		if err != nil {
			return copied, err
		}
		for next < l.size {
			rs, err := audit.RowsBetween(ctx, p.db, l.tenant, next, l.size, int64(p.batch))
			if err != nil {
				return copied, fmt.Errorf("auditlog: read rows to copy: %w", err)
			}
			recs := make([]Record, 0, len(rs))
			for i, r := range rs {
				if r.Seq != next+int64(i) {
					return copied, fmt.Errorf("%w: tenant %s has no row at seq %d; the sink stops there", ErrTampered, l.tenant, next+int64(i))
				}
				recs = append(recs, Record{Row: r, Leaf: LeafHash(r)})
			}
			if len(recs) == 0 {
				return copied, fmt.Errorf("%w: tenant %s has no row at seq %d; the sink stops there", ErrTampered, l.tenant, next)
			}
			if err := p.sink.Append(ctx, l.tenant, recs); err != nil {
				return copied, fmt.Errorf("auditlog: sink %s: %w", p.name, err)
			}
			next += int64(len(recs))
			if err := p.advance(ctx, l.tenant, next, false); err != nil {
				return copied, err
			}
			copied += len(recs)
		}
		// After the rows, the checkpoint of their size: once a size in this
		// process, and again after a failed copy (the cursor has moved past
		// the rows, so the check is not inside the row loop).
		if next == l.size && l.size > 0 && p.cpDone[l.tenant] != l.size {
			if err := p.copyCheckpoint(ctx, l.tenant, l.size); err != nil {
				return copied, err
			}
			p.cpDone[l.tenant] = l.size
		}
	}
	return copied, nil
}

// copyCheckpoint copies the tenant's checkpoint of size, the size its
// log's state gives: a seal writes the two together, so a state with no
// checkpoint of its size was changed by hand and copying stops there.
func (p *Pump) copyCheckpoint(ctx context.Context, tenant string, size int64) error {
	var n []byte
	err := p.db.QueryRowContext(ctx, qCheckpointAt, tenant, size).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: tenant %s has no checkpoint of its log's size %d; the sink stops there", ErrTampered, tenant, size)
	}
	if err != nil {
		return fmt.Errorf("auditlog: read checkpoint to copy: %w", err)
	}
	if err := p.sink.AppendCheckpoint(ctx, SinkCheckpoint{TenantID: tenant, Size: size, Note: string(n)}); err != nil {
		return fmt.Errorf("auditlog: sink %s: %w", p.name, err)
	}
	return nil
}

func (p *Pump) cursor(ctx context.Context, tenant string) (int64, error) {
	var next int64
	err := p.db.QueryRowContext(ctx, qSinkCursor, p.name, tenant).Scan(&next)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("auditlog: read sink cursor: %w", err)
	}
	return next, nil
}

// advance stores the cursor; onlyForward keeps a cursor already past next.
func (p *Pump) advance(ctx context.Context, tenant string, next int64, onlyForward bool) error {
	q := qAdvanceCursor
	if onlyForward {
		q += qCursorOnlyForward
	}
	if _, err := p.db.ExecContext(ctx, q, p.name, tenant, next, p.clk.Now().UnixMilli()); err != nil {
		return fmt.Errorf("auditlog: store sink cursor: %w", err)
	}
	return nil
}

// SetBatch sets how many rows the pump hands the sink at once (tests).
func (p *Pump) SetBatch(n int) {
	if n > 0 {
		p.batch = n
	}
}
