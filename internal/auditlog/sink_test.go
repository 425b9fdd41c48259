package auditlog_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"gocloud.dev/blob"

	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// flakySink fails while down is set, and otherwise keeps what it is given.
type flakySink struct {
	down   bool
	cpDown bool // only checkpoints fail
	got    []auditlog.Record
	cps    []auditlog.SinkCheckpoint
}

func (s *flakySink) AppendCheckpoint(_ context.Context, c auditlog.SinkCheckpoint) error {
	if s.down || s.cpDown {
		return errors.New("sink unreachable")
	}
	s.cps = append(s.cps, c)
	return nil
}

func (s *flakySink) Append(_ context.Context, _ string, recs []auditlog.Record) error {
	if s.down {
		return errors.New("sink unreachable")
	}
	s.got = append(s.got, recs...)
	return nil
}
func (s *flakySink) Last(context.Context) (string, int64, bool, error) { return "", 0, false, nil }
func (s *flakySink) Close() error                                      { return nil }

func seqsOf(recs []auditlog.Record, tenant string) []int64 {
	var out []int64
	for _, r := range recs {
		if r.TenantID == tenant {
			out = append(out, r.Seq)
		}
	}
	return out
}

func count(n int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i)
	}
	return out
}

// TestSinkOutageDelaysNeverDropsOrReorders: while the sink is down nothing
// is copied and the cursor stays; once it is back every row arrives, in seq
// order, exactly once.
func TestSinkOutageDelaysNeverDropsOrReorders(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		f := newFixture(t, db, 4)
		sink := &flakySink{}
		pump := auditlog.NewPump(db, sink, "test", f.clk, quietLogger())
		pump.SetBatch(3)
		f.record(t, iam.RootTenant, 5)
		f.record(t, "t2", 2)
		if _, err := f.log.SealAll(ctx, f.key); err != nil {
			t.Fatal(err)
		}
		if n, err := pump.Run(ctx); err != nil || n != 7 {
			t.Fatalf("first copy: %d %v", n, err)
		}
		sink.down = true
		f.record(t, iam.RootTenant, 6)
		if _, err := f.log.SealAll(ctx, f.key); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if n, err := pump.Run(ctx); err == nil || n != 0 {
				t.Fatalf("copy during outage: %d %v, want an error and nothing copied", n, err)
			}
		}
		sink.down = false
		if n, err := pump.Run(ctx); err != nil || n != 6 {
			t.Fatalf("copy after outage: %d %v, want 6", n, err)
		}
		if n, err := pump.Run(ctx); err != nil || n != 0 {
			t.Fatalf("copy again: %d %v, want 0", n, err)
		}
		if got := seqsOf(sink.got, iam.RootTenant); !slices.Equal(got, count(11)) {
			t.Fatalf("root seqs copied %v", got)
		}
		if got := seqsOf(sink.got, "t2"); !slices.Equal(got, count(2)) {
			t.Fatalf("t2 seqs copied %v", got)
		}
		// Each run that brought a tenant's copy up to its log's size copied
		// the checkpoint of that size too; the outage none.
		var cps []string
		for _, c := range sink.cps {
			cps = append(cps, fmt.Sprintf("%s@%d", c.TenantID, c.Size))
		}
		if want := []string{iam.RootTenant + "@5", "t2@2", iam.RootTenant + "@11"}; !slices.Equal(cps, want) {
			t.Fatalf("checkpoints copied %v, want %v", cps, want)
		}
		for _, r := range sink.got {
			if string(r.Leaf) != string(auditlog.LeafHash(r.Row)) {
				t.Fatalf("record %d carries a wrong leaf", r.Seq)
			}
		}
	})
}

// TestSinkCheckpointAfterFailedCopy: a checkpoint whose copy failed after
// its rows were copied is copied by the next run, though no row is left.
func TestSinkCheckpointAfterFailedCopy(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewTestSQLite(t)
	f := newFixture(t, db, 100)
	sink := &flakySink{cpDown: true}
	pump := auditlog.NewPump(db, sink, "test", f.clk, quietLogger())
	f.record(t, iam.RootTenant, 3)
	f.seal(t, iam.RootTenant)
	if n, err := pump.Run(ctx); err == nil || n != 3 {
		t.Fatalf("copy with checkpoints failing: %d %v, want 3 rows and an error", n, err)
	}
	sink.cpDown = false
	if n, err := pump.Run(ctx); err != nil || n != 0 || len(sink.cps) != 1 || sink.cps[0].Size != 3 {
		t.Fatalf("next copy: %d %v, checkpoints %+v, want the checkpoint of size 3", n, err, sink.cps)
	}
	if _, err := pump.Run(ctx); err != nil || len(sink.cps) != 1 {
		t.Fatalf("a third copy: %v, checkpoints %+v, want it copied once", err, sink.cps)
	}
}

// TestFileSinkExactlyOnceAfterCrash: a copy written to the file but not
// recorded in the cursor (a crash in between) is not written again.
func TestFileSinkExactlyOnceAfterCrash(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		f := newFixture(t, db, 100)
		path := filepath.Join(t.TempDir(), "audit.jsonl")
		sink, err := auditlog.OpenFileSink(path)
		if err != nil {
			t.Fatal(err)
		}
		f.record(t, iam.RootTenant, 4)
		f.seal(t, iam.RootTenant)
		if _, err := auditlog.NewPump(db, sink, "file", f.clk, quietLogger()).Run(ctx); err != nil {
			t.Fatal(err)
		}
		f.record(t, iam.RootTenant, 3)
		f.seal(t, iam.RootTenant)
		if _, err := auditlog.NewPump(db, sink, "file", f.clk, quietLogger()).Run(ctx); err != nil {
			t.Fatal(err)
		}
		// The crash: the cursor goes back as if its update never committed,
		// and the last write was torn after a partial line.
		if _, err := db.ExecContext(ctx, `UPDATE audit_sink_cursors SET next_seq = 4`); err != nil {
			t.Fatal(err)
		}
		sink.Close()
		fh, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		fh.WriteString(`{"seq":7,"id":"ev_torn`)
		fh.Close()
		f.record(t, iam.RootTenant, 2)
		f.seal(t, iam.RootTenant)
		sink, err = auditlog.OpenFileSink(path)
		if err != nil {
			t.Fatal(err)
		}
		defer sink.Close()
		if n, err := auditlog.NewPump(db, sink, "file", f.clk, quietLogger()).Run(ctx); err != nil || n != 2 {
			t.Fatalf("resume: %d %v, want the 2 new rows only", n, err)
		}
		st, _ := os.Stat(path)
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("sink file mode %v, want 0600", st.Mode().Perm())
		}
		fh, _ = os.Open(path)
		defer fh.Close()
		var seqs []int64
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			var r auditlog.Record
			if json.Unmarshal(sc.Bytes(), &r) != nil || r.ID == "" {
				continue // the torn fragment, or a checkpoint
			}
			seqs = append(seqs, r.Seq)
		}
		if !slices.Equal(seqs, count(9)) {
			t.Fatalf("file holds seqs %v, want 0..8 once each in order", seqs)
		}
	})
}

func TestBlobSinkWritesOneObjectPerRow(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewTestSQLite(t)
	f := newFixture(t, db, 100)
	dir := t.TempDir()
	sink, err := auditlog.OpenSink(ctx, "file://"+dir)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	f.record(t, iam.RootTenant, 3)
	f.seal(t, iam.RootTenant)
	pump := auditlog.NewPump(db, sink, "bucket", f.clk, quietLogger())
	if n, err := pump.Run(ctx); err != nil || n != 3 {
		t.Fatalf("copy: %d %v", n, err)
	}
	// A repeat (cursor lost) rewrites the same objects: still one per row.
	if _, err := db.ExecContext(ctx, `DELETE FROM audit_sink_cursors`); err != nil {
		t.Fatal(err)
	}
	if _, err := auditlog.NewPump(db, sink, "bucket", f.clk, quietLogger()).Run(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := blob.OpenBucket(ctx, "file://"+dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var keys []string
	it := b.List(nil)
	for {
		o, err := it.Next(ctx)
		if err != nil {
			break
		}
		keys = append(keys, o.Key)
	}
	want := []string{auditlog.BlobKey(iam.RootTenant, 0), auditlog.BlobKey(iam.RootTenant, 1), auditlog.BlobKey(iam.RootTenant, 2), auditlog.CheckpointKey(iam.RootTenant, 3)}
	if !slices.Equal(keys, want) {
		t.Fatalf("objects %v, want %v", keys, want)
	}
	data, err := b.ReadAll(ctx, want[1])
	if err != nil {
		t.Fatal(err)
	}
	var r auditlog.Record
	if err := json.Unmarshal(data, &r); err != nil || r.Seq != 1 || r.TenantID != iam.RootTenant {
		t.Fatalf("object: %+v %v", r, err)
	}
}
