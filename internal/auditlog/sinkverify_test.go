package auditlog_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gocloud.dev/blob"

	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// fillSinks seals two batches of the root tenant's rows (5, then 3) and
// one of t2's (2), pumping after each seal into every sink spec given.
func fillSinks(t *testing.T, f *fixture, db *store.DB, specs ...string) {
	t.Helper()
	ctx := context.Background()
	var sinks []auditlog.Sink
	for _, spec := range specs {
		s, err := auditlog.OpenSink(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		sinks = append(sinks, s)
	}
	pump := func() {
		for i, s := range sinks {
			if _, err := auditlog.NewPump(db, s, specs[i], f.clk, quietLogger()).Run(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.record(t, iam.RootTenant, 5)
	f.record(t, "t2", 2)
	if _, err := f.log.SealAll(ctx, f.key); err != nil {
		t.Fatal(err)
	}
	pump()
	f.record(t, iam.RootTenant, 3)
	f.seal(t, iam.RootTenant)
	pump()
}

// TestVerifySinkOffline: a file sink and a bucket sink each hold every
// tenant's rows and the checkpoints that cover them, and check without
// the database: all rows, every checkpoint signed and with the rows' root.
func TestVerifySinkOffline(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		f := newFixture(t, db, 100)
		dir := t.TempDir()
		if err := os.Mkdir(filepath.Join(dir, "bucket"), 0o700); err != nil {
			t.Fatal(err)
		}
		specs := []string{filepath.Join(dir, "audit.jsonl"), "file://" + filepath.Join(dir, "bucket")}
		fillSinks(t, f, db, specs...)
		for _, spec := range specs {
			c, err := auditlog.ReadSink(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Tenants(); !slices.Equal(got, []string{iam.RootTenant, "t2"}) {
				t.Fatalf("%s: tenants %v", spec, got)
			}
			for tenant, want := range map[string]auditlog.SinkReport{
				iam.RootTenant: {Rows: 8, Checkpoints: 2, Covered: 8},
				"t2":           {Rows: 2, Checkpoints: 1, Covered: 2},
			} {
				rep := auditlog.VerifySink(c, tenant, f.v)
				if !rep.OK() || rep.Rows != want.Rows || rep.Checkpoints != want.Checkpoints || rep.Covered != want.Covered || len(rep.Held) != want.Checkpoints {
					t.Fatalf("%s %s: %+v, want %+v and no findings", spec, tenant, rep, want)
				}
			}
		}
	})
}

// sinkLines is a good sink file's lines: root's rows 0-4, t2's 0-1,
// root's checkpoint 5, t2's 2, root's rows 5-7, root's checkpoint 8.
func sinkLines(t *testing.T) (*fixture, []string) {
	t.Helper()
	db := storetest.NewTestSQLite(t)
	f := newFixture(t, db, 100)
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	fillSinks(t, f, db, path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return f, strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// lineOf finds the line of root's row seq, or of root's checkpoint of
// size when seq < 0.
func lineOf(t *testing.T, lines []string, seq, size int64) int {
	t.Helper()
	for i, l := range lines {
		var probe struct {
			TenantID   string  `json:"tenant"`
			Seq        int64   `json:"seq"`
			Size       int64   `json:"size"`
			Checkpoint *string `json:"checkpoint"`
		}
		if json.Unmarshal([]byte(l), &probe) != nil || probe.TenantID != iam.RootTenant {
			continue
		}
		if (seq >= 0 && probe.Checkpoint == nil && probe.Seq == seq) || (seq < 0 && probe.Checkpoint != nil && probe.Size == size) {
			return i
		}
	}
	t.Fatalf("no line for seq %d size %d", seq, size)
	return -1
}

// editRow rewrites root's row seq through edit, keeping (or, with
// releaf, recomputing) the leaf copied with it.
func editRow(t *testing.T, lines []string, seq int64, releaf bool, edit func(*auditlog.Record)) {
	t.Helper()
	i := lineOf(t, lines, seq, 0)
	var r auditlog.Record
	if err := json.Unmarshal([]byte(lines[i]), &r); err != nil {
		t.Fatal(err)
	}
	edit(&r)
	if releaf {
		r.Leaf = auditlog.LeafHash(r.Row)
	}
	b, _ := json.Marshal(r)
	lines[i] = string(b)
}

// signedCheckpointLine is a sink line holding a checkpoint of root's log
// of size with root hash, signed by signer.
func signedCheckpointLine(t *testing.T, f *fixture, size int64, hash []byte, seed byte) string {
	t.Helper()
	signer, err := auditlog.NewSigner(deployment, seedKey(seed))
	if err != nil {
		t.Fatal(err)
	}
	n, err := auditlog.SignCheckpoint(auditlog.Checkpoint{Origin: auditlog.Origin(deployment, iam.RootTenant), Size: uint64(size), Root: hash}, signer)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(auditlog.SinkCheckpoint{TenantID: iam.RootTenant, Size: size, Note: string(n)})
	return string(b)
}

// TestVerifySinkFindsTampering: each change to a sink's copy (by whoever
// can write the sink) is one finding, named by its kind: a row edited (as
// copied, or with its leaf recomputed to match), deleted, or given twice
// with another content; a checkpoint edited, signed by another key, taken
// from another tenant, or a second one of a size with another root (a
// fork signed by the real key).
func TestVerifySinkFindsTampering(t *testing.T) {
	f, good := sinkLines(t)
	bogus := bytes.Repeat([]byte{7}, 32)
	cases := map[string]struct {
		change func([]string) []string
		want   []string
	}{
		"untouched": {func(l []string) []string { return l }, nil},
		"row edited": {func(l []string) []string {
			editRow(t, l, 2, false, func(r *auditlog.Record) { r.Actor = "user:mallory" })
			return l
		}, []string{auditlog.FindingSinkLeafMismatch, auditlog.FindingRootMismatch, auditlog.FindingRootMismatch}},
		"row edited, leaf recomputed": {func(l []string) []string {
			editRow(t, l, 6, true, func(r *auditlog.Record) { r.Outcome = "denied" })
			return l
		}, []string{auditlog.FindingRootMismatch}},
		"row deleted": {func(l []string) []string {
			i := lineOf(t, l, 3, 0)
			return slices.Delete(l, i, i+1)
		}, []string{auditlog.FindingSinkRowMissing}},
		"last row deleted": {func(l []string) []string {
			i := lineOf(t, l, 7, 0)
			return slices.Delete(l, i, i+1)
		}, []string{auditlog.FindingSinkRowMissing}},
		"row given twice": {func(l []string) []string {
			other := slices.Clone(l)
			editRow(t, other, 1, true, func(r *auditlog.Record) { r.Resource = "node/elsewhere" })
			return append(l, other[lineOf(t, other, 1, 0)])
		}, []string{auditlog.FindingSinkRowConflict}},
		"checkpoint edited": {func(l []string) []string {
			i := lineOf(t, l, -1, 8)
			l[i] = strings.Replace(l[i], `\n8\n`, `\n9\n`, 1)
			return l
		}, []string{auditlog.FindingCheckpointEdited}},
		"checkpoint by another key": {func(l []string) []string {
			return append(l, signedCheckpointLine(t, f, 8, bogus, 9))
		}, []string{auditlog.FindingCheckpointBadSignature}},
		"checkpoint of another tenant": {func(l []string) []string {
			for _, line := range l {
				if strings.Contains(line, `"checkpoint"`) && strings.Contains(line, `"tenant":"t2"`) {
					return append(l, strings.Replace(line, `"tenant":"t2"`, `"tenant":"`+iam.RootTenant+`"`, 1))
				}
			}
			t.Fatal("no checkpoint of t2")
			return nil
		}, []string{auditlog.FindingCheckpointEdited}},
		"fork": {func(l []string) []string {
			return append(l, signedCheckpointLine(t, f, 8, bogus, 7))
		}, []string{auditlog.FindingCheckpointForked, auditlog.FindingRootMismatch}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			lines := c.change(slices.Clone(good))
			got, err := auditlog.ReadSink(context.Background(), writeLines(t, lines))
			if err != nil {
				t.Fatal(err)
			}
			rep := auditlog.VerifySink(got, iam.RootTenant, f.v)
			want := slices.Clone(c.want)
			slices.Sort(want)
			if !slices.Equal(findingKinds(rep), want) {
				t.Fatalf("findings %v, want %v", rep.Findings, c.want)
			}
			if t2 := auditlog.VerifySink(got, "t2", f.v); !t2.OK() || t2.Rows != 2 {
				t.Fatalf("t2, untouched: %+v", t2)
			}
		})
	}
}

// findingKinds is the kinds of rep's findings, sorted.
func findingKinds(rep *auditlog.SinkReport) []string {
	var kinds []string
	for _, fd := range rep.Findings {
		kinds = append(kinds, fd.Kind)
	}
	slices.Sort(kinds)
	return kinds
}

func writeLines(t *testing.T, lines []string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sink.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestVerifySinkBucketMisplaced: an object of a bucket sink whose row is
// not the one its key names (a row copied over another) is a finding.
func TestVerifySinkBucketMisplaced(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewTestSQLite(t)
	f := newFixture(t, db, 100)
	spec := "file://" + t.TempDir()
	fillSinks(t, f, db, spec)
	b, err := blob.OpenBucket(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	one, err := b.ReadAll(ctx, auditlog.BlobKey(iam.RootTenant, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteAll(ctx, auditlog.BlobKey(iam.RootTenant, 4), one, nil); err != nil {
		t.Fatal(err)
	}
	c, err := auditlog.ReadSink(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	rep := auditlog.VerifySink(c, iam.RootTenant, f.v)
	if want := []string{auditlog.FindingSinkRowMisplaced, auditlog.FindingSinkRowMissing}; !slices.Equal(findingKinds(rep), want) {
		t.Fatalf("findings %v, want %v", rep.Findings, want)
	}
}
