package auditlog_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

const deployment = "test.bc.local"

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

type fixture struct {
	db  *store.DB
	clk *clock.Fake
	log *auditlog.Log
	key *auditlog.SigningKey
	v   note.Verifier
	pub ed25519.PublicKey
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func seedKey(b byte) ed25519.PrivateKey {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = b
	}
	return ed25519.NewKeyFromSeed(seed)
}

func newFixture(t testing.TB, db *store.DB, batch int) *fixture {
	t.Helper()
	clk := clock.NewFake(t0)
	l, err := auditlog.New(auditlog.Config{DB: db, Deployment: deployment, Clock: clk, Log: quietLogger(), SealBatch: batch})
	if err != nil {
		t.Fatal(err)
	}
	priv := seedKey(7)
	key, err := auditlog.NewSigningKey(deployment, priv)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{db: db, clk: clk, log: l, key: key, v: key.Verifier, pub: priv.Public().(ed25519.PublicKey)}
}

// record writes n audit rows for tenant through audit.Record, one
// transaction each, and returns their ids in the order written.
func (f *fixture) record(t testing.TB, tenant string, n int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := 0; i < n; i++ {
		f.clk.Advance(time.Millisecond)
		err := f.db.Tx(ctx, func(tx *sql.Tx) error {
			return audit.Record(ctx, tx, f.clk.Now(), audit.Entry{TenantID: tenant, Actor: "user:alice", Action: "nodes.revoke",
				Resource: fmt.Sprintf("node/n%d", i), Outcome: "allowed", RequestID: fmt.Sprintf("req-%d", i), Caller: "127.0.0.1",
				Details: map[string]any{"i": i}})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	rows, err := f.db.QueryContext(ctx, `SELECT id FROM audit_events WHERE tenant_id = $1 AND seq IS NULL ORDER BY at, id`, tenant)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func (f *fixture) seal(t testing.TB, tenant string) []auditlog.SealResult {
	t.Helper()
	res, err := f.log.Seal(context.Background(), tenant, f.key)
	if err != nil {
		t.Fatalf("seal: %v", err)
	}
	return res
}

func (f *fixture) verify(t testing.TB, tenant string) []string {
	t.Helper()
	rep, err := f.log.Verify(context.Background(), tenant, f.v, nil)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	var out []string
	for _, fd := range rep.Findings {
		out = append(out, fd.String())
	}
	return out
}

func (f *fixture) exec(t testing.TB, q string, args ...any) {
	t.Helper()
	res, err := f.db.ExecContext(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		t.Fatalf("%s: no row affected", q)
	}
}

func TestSealVerifyProveRoundTrip(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		f := newFixture(t, db, 4) // small batches: several checkpoints per seal
		ids := f.record(t, iam.RootTenant, 10)
		res := f.seal(t, iam.RootTenant)
		if len(res) != 3 || res[2].Size != 10 {
			t.Fatalf("seal results = %+v, want 3 checkpoints ending at size 10", res)
		}
		ids = append(ids, f.record(t, iam.RootTenant, 7)...)
		f.record(t, "other", 3)
		if _, err := f.log.SealAll(ctx, f.key); err != nil {
			t.Fatal(err)
		}
		if got := f.verify(t, iam.RootTenant); len(got) != 0 {
			t.Fatalf("untouched log: findings %v", got)
		}
		if got := f.verify(t, "other"); len(got) != 0 {
			t.Fatalf("untouched log: findings %v", got)
		}
		evs, err := f.log.List(ctx, iam.RootTenant, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 17 {
			t.Fatalf("list: %d events, want 17", len(evs))
		}
		for i, e := range evs {
			if e.ID != ids[i] || e.Seq == nil || *e.Seq != int64(i) || !e.Sealed {
				t.Fatalf("event %d = %+v, want id %s seq %d sealed", i, e, ids[i], i)
			}
			p, err := f.log.Prove(ctx, iam.RootTenant, e.ID)
			if err != nil {
				t.Fatalf("prove %s: %v", e.ID, err)
			}
			got, err := auditlog.CheckProof(p.Marshal(), f.v)
			if err != nil {
				t.Fatalf("check-proof %s: %v", e.ID, err)
			}
			if got.Row.ID != e.ID || got.Row.Seq != int64(i) || got.Checkpoint.Size != 17 {
				t.Fatalf("proved %+v", got)
			}
		}
		// An unsealed row is listed as such and has no proof yet.
		late := f.record(t, iam.RootTenant, 1)[0]
		evs, _ = f.log.List(ctx, iam.RootTenant, 17, 0)
		if len(evs) != 1 || evs[0].ID != late || evs[0].Seq != nil || evs[0].Sealed {
			t.Fatalf("unsealed listing = %+v", evs)
		}
		if _, err := f.log.Prove(ctx, iam.RootTenant, late); !errors.Is(err, auditlog.ErrNotSealed) {
			t.Fatalf("prove unsealed: %v, want ErrNotSealed", err)
		}
		if _, err := f.log.Prove(ctx, "other", ids[0]); !errors.Is(err, auditlog.ErrNotFound) {
			t.Fatalf("prove in another tenant: %v, want ErrNotFound", err)
		}
	})
}

// TestVerifyFindsTampering tampers with the database directly and checks
// that verify names exactly what was done.
func TestVerifyFindsTampering(t *testing.T) {
	type tc struct {
		name   string
		tamper func(t *testing.T, f *fixture, ids []string)
		want   func(ids []string) []string
	}
	cases := []tc{
		{"untouched", func(*testing.T, *fixture, []string) {}, func([]string) []string { return nil }},
		{"row-edited", func(t *testing.T, f *fixture, ids []string) {
			f.exec(t, `UPDATE audit_events SET outcome = 'denied' WHERE id = $1`, ids[5])
		}, func(ids []string) []string { return []string{"row-edited seq=5 event=" + ids[5]} }},
		{"row-edited-details", func(t *testing.T, f *fixture, ids []string) {
			f.exec(t, `UPDATE audit_events SET details = '{"i": 9}' WHERE id = $1`, ids[9])
		}, func(ids []string) []string { return []string{"row-edited seq=9 event=" + ids[9]} }},
		{"row-deleted", func(t *testing.T, f *fixture, ids []string) {
			f.exec(t, `DELETE FROM audit_events WHERE id = $1`, ids[3])
		}, func(ids []string) []string { return []string{"row-deleted seq=3 event=" + ids[3]} }},
		{"row-inserted", func(t *testing.T, f *fixture, ids []string) {
			f.exec(t, `INSERT INTO audit_events (id, tenant_id, at, actor, action, resource, outcome, seq) VALUES ('ev_forged', 'root', 1, 'user:mallory', 'nodes.revoke', 'node/x', 'allowed', 12)`)
		}, func([]string) []string {
			return []string{"row-inserted seq=12 event=ev_forged (numbered past the log's size 12)"}
		}},
		{"row-and-leaf-forged-past-the-log", func(t *testing.T, f *fixture, ids []string) {
			r := auditlog.Row{Seq: 1000000, ID: "ev_forged", TenantID: "root", At: 1, Actor: "user:mallory", Action: "nodes.revoke", Resource: "node/x", Outcome: "allowed", Details: "{}"}
			f.exec(t, `INSERT INTO audit_events (id, tenant_id, at, actor, action, resource, outcome, seq) VALUES ('ev_forged', 'root', 1, 'user:mallory', 'nodes.revoke', 'node/x', 'allowed', 1000000)`)
			f.exec(t, `INSERT INTO audit_log_nodes (tenant_id, level, idx, hash, event_id) VALUES ('root', 0, 1000000, $1, 'ev_forged')`, auditlog.LeafHash(r))
		}, func([]string) []string {
			return []string{"row-inserted seq=1000000 event=ev_forged (numbered past the log's size 12)"}
		}},
		{"tail-rolled-back-and-rewritten", func(t *testing.T, f *fixture, ids []string) {
			// The last checkpoint deleted and the log's size set back to the
			// one before, its rows kept, one of them rewritten with its leaf.
			f.exec(t, `DELETE FROM audit_checkpoints WHERE tenant_id = 'root' AND size = 12`)
			f.exec(t, `UPDATE audit_log_state SET size = 8 WHERE tenant_id = 'root'`)
			f.exec(t, `UPDATE audit_events SET actor = 'user:mallory' WHERE id = $1`, ids[9])
		}, func(ids []string) []string {
			var out []string
			for i := 8; i < 12; i++ {
				out = append(out, fmt.Sprintf("row-inserted seq=%d event=%s (numbered past the log's size 8)", i, ids[i]))
			}
			return out
		}},
		{"row-inserted-renumbered", func(t *testing.T, f *fixture, ids []string) {
			f.exec(t, `UPDATE audit_events SET seq = seq + 1000 WHERE tenant_id = 'root' AND seq >= 10`)
			f.exec(t, `UPDATE audit_events SET seq = seq - 999 WHERE tenant_id = 'root' AND seq >= 1000`)
			f.exec(t, `INSERT INTO audit_events (id, tenant_id, at, actor, action, resource, outcome, seq) VALUES ('ev_forged', 'root', 1, 'user:mallory', 'nodes.revoke', 'node/x', 'allowed', 10)`)
		}, func(ids []string) []string {
			return []string{"row-edited seq=10 event=" + ids[10] + " (renumbered to 11)",
				"row-inserted seq=10 event=ev_forged (no sealed leaf has this event)", "row-edited seq=11 event=" + ids[11] + " (renumbered to 12)"}
		}},
		{"checkpoint-deleted", func(t *testing.T, f *fixture, ids []string) {
			f.exec(t, `DELETE FROM audit_checkpoints WHERE tenant_id = 'root' AND size = 8`)
		}, func([]string) []string {
			return []string{"checkpoint-missing size=8 (the checkpoint of size 12 names it as its predecessor)"}
		}},
		{"last-checkpoint-deleted", func(t *testing.T, f *fixture, ids []string) {
			f.exec(t, `DELETE FROM audit_checkpoints WHERE tenant_id = 'root' AND size = 12`)
		}, func([]string) []string {
			return []string{"checkpoint-missing size=12 (the log's size has no checkpoint)"}
		}},
		{"checkpoint-edited", func(t *testing.T, f *fixture, ids []string) {
			var msg []byte
			if err := f.db.QueryRowContext(context.Background(), `SELECT note FROM audit_checkpoints WHERE tenant_id = 'root' AND size = 8`).Scan(&msg); err != nil {
				t.Fatal(err)
			}
			edited := strings.Replace(string(msg), "\n8\n", "\n9\n", 1)
			f.exec(t, `UPDATE audit_checkpoints SET note = $1 WHERE tenant_id = 'root' AND size = 8`, []byte(edited))
		}, func([]string) []string { return []string{"checkpoint-edited size=8"} }},
		{"checkpoint-resigned", func(t *testing.T, f *fixture, ids []string) {
			var msg []byte
			if err := f.db.QueryRowContext(context.Background(), `SELECT note FROM audit_checkpoints WHERE tenant_id = 'root' AND size = 4`).Scan(&msg); err != nil {
				t.Fatal(err)
			}
			other, err := auditlog.NewSigner(deployment, seedKey(9)) // same name, another key
			if err != nil {
				t.Fatal(err)
			}
			body := string(msg[:strings.LastIndex(string(msg), "\n\n")+1])
			resigned, err := note.Sign(&note.Note{Text: body}, other)
			if err != nil {
				t.Fatal(err)
			}
			f.exec(t, `UPDATE audit_checkpoints SET note = $1 WHERE tenant_id = 'root' AND size = 4`, resigned)
		}, func([]string) []string {
			return []string{"checkpoint-bad-signature size=4 (checkpoint-bad-signature: not signed by test.bc.local/audit)"}
		}},
		{"row-and-leaf-edited", func(t *testing.T, f *fixture, ids []string) {
			f.exec(t, `UPDATE audit_events SET actor = 'user:mallory' WHERE id = $1`, ids[6])
			var r auditlog.Row
			if err := f.db.QueryRowContext(context.Background(), `SELECT seq, id, tenant_id, at, actor, action, resource, outcome, request_id, caller, details FROM audit_events WHERE id = $1`, ids[6]).
				Scan(&r.Seq, &r.ID, &r.TenantID, &r.At, &r.Actor, &r.Action, &r.Resource, &r.Outcome, &r.RequestID, &r.Caller, &r.Details); err != nil {
				t.Fatal(err)
			}
			f.exec(t, `UPDATE audit_log_nodes SET hash = $1 WHERE tenant_id = 'root' AND level = 0 AND idx = 6`, auditlog.LeafHash(r))
		}, func([]string) []string {
			return []string{"root-mismatch size=8 (rows 4..7 and the stored tree do not hash to the signed root)"}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
				f := newFixture(t, db, 4)
				ids := f.record(t, iam.RootTenant, 12)
				f.seal(t, iam.RootTenant) // checkpoints at 4, 8, 12
				c.tamper(t, f, ids)
				got := f.verify(t, iam.RootTenant)
				want := c.want(ids)
				if c.name == "checkpoint-edited" {
					// The detail carries the note library's message; the kind and size are the claim.
					for i := range got {
						got[i] = strings.SplitN(got[i], " (", 2)[0]
					}
				}
				if !slices.Equal(got, want) {
					t.Fatalf("findings:\n got  %q\n want %q", got, want)
				}
				// The CLI-facing exit decision: OK only when nothing was found.
				rep, err := f.log.Verify(context.Background(), iam.RootTenant, f.v, nil)
				if err != nil || rep.OK() != (len(want) == 0) {
					t.Fatalf("OK() = %v, err %v", rep.OK(), err)
				}
			})
		})
	}
}

func TestVerifyUnderAnotherKeyRefusesEveryCheckpoint(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		f := newFixture(t, db, 4)
		f.record(t, iam.RootTenant, 8)
		f.seal(t, iam.RootTenant)
		other, err := auditlog.NewSigningKey(deployment, seedKey(3))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := f.log.Verify(context.Background(), iam.RootTenant, other.Verifier, nil)
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, fd := range rep.Findings {
			kinds = append(kinds, fd.Kind)
		}
		if !slices.Equal(kinds, []string{"checkpoint-bad-signature", "checkpoint-bad-signature"}) {
			t.Fatalf("findings %v", rep.Findings)
		}
	})
}

// TestSealRefusesToExtendATamperedLog: whatever part of the stored state
// no longer hashes to the last signed checkpoint (the checkpoint deleted,
// re-signed with another key, the stored compact range edited, or the
// stored tree the consistency proof is read from edited), the sealer
// refuses with ErrTampered, and the refused seal changes nothing: no row
// numbered, no checkpoint, no tree node, the log state as it was.
func TestSealRefusesToExtendATamperedLog(t *testing.T) {
	cases := []struct {
		name   string
		tamper func(t *testing.T, f *fixture)
	}{
		{"checkpoint-deleted", func(t *testing.T, f *fixture) {
			f.exec(t, `DELETE FROM audit_checkpoints WHERE tenant_id = 'root'`)
		}},
		{"checkpoint-resigned", func(t *testing.T, f *fixture) {
			var msg []byte
			if err := f.db.QueryRowContext(context.Background(), `SELECT note FROM audit_checkpoints WHERE tenant_id = 'root' AND size = 5`).Scan(&msg); err != nil {
				t.Fatal(err)
			}
			other, err := auditlog.NewSigner(deployment, seedKey(9))
			if err != nil {
				t.Fatal(err)
			}
			resigned, err := note.Sign(&note.Note{Text: string(msg[:strings.LastIndex(string(msg), "\n\n")+1])}, other)
			if err != nil {
				t.Fatal(err)
			}
			f.exec(t, `UPDATE audit_checkpoints SET note = $1 WHERE tenant_id = 'root' AND size = 5`, resigned)
		}},
		{"compact-state-edited", func(t *testing.T, f *fixture) {
			var blob []byte
			if err := f.db.QueryRowContext(context.Background(), `SELECT compact FROM audit_log_state WHERE tenant_id = 'root'`).Scan(&blob); err != nil {
				t.Fatal(err)
			}
			blob[0] ^= 1
			f.exec(t, `UPDATE audit_log_state SET compact = $1 WHERE tenant_id = 'root'`, blob)
		}},
		{"tree-edited", func(t *testing.T, f *fixture) {
			f.exec(t, `UPDATE audit_log_nodes SET hash = $1 WHERE tenant_id = 'root'`, make([]byte, 32))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
				ctx := context.Background()
				f := newFixture(t, db, 100)
				f.record(t, iam.RootTenant, 5)
				f.seal(t, iam.RootTenant)
				c.tamper(t, f)
				f.record(t, iam.RootTenant, 2)
				snapshot := func() string {
					var unsealed, checkpoints, nodes, size int64
					var blob []byte
					for _, q := range []struct {
						sql  string
						dest []any
					}{
						{`SELECT COUNT(*) FROM audit_events WHERE seq IS NULL`, []any{&unsealed}},
						{`SELECT COUNT(*) FROM audit_checkpoints`, []any{&checkpoints}},
						{`SELECT COUNT(*) FROM audit_log_nodes`, []any{&nodes}},
						{`SELECT size, compact FROM audit_log_state WHERE tenant_id = 'root'`, []any{&size, &blob}},
					} {
						if err := db.QueryRowContext(ctx, q.sql).Scan(q.dest...); err != nil {
							t.Fatalf("%s: %v", q.sql, err)
						}
					}
					return fmt.Sprintf("unsealed=%d checkpoints=%d nodes=%d size=%d compact=%x", unsealed, checkpoints, nodes, size, blob)
				}
				before := snapshot()
				if !strings.HasPrefix(before, "unsealed=2 ") {
					t.Fatalf("before the seal: %s, want 2 unsealed rows", before)
				}
				if _, err := f.log.Seal(ctx, iam.RootTenant, f.key); !errors.Is(err, auditlog.ErrTampered) {
					t.Fatalf("seal over a tampered log: %v, want ErrTampered", err)
				}
				if after := snapshot(); after != before {
					t.Fatalf("a refused seal changed the log:\n before %s\n after  %s", before, after)
				}
			})
		})
	}
}

// TestVerifyNamesAnEditOfEveryColumn edits each column of one sealed row
// in the database, one at a time: verify names each edit row-edited, so
// the sealer and the verifier both read every field into the leaf hash.
func TestVerifyNamesAnEditOfEveryColumn(t *testing.T) {
	for col, set := range map[string]string{
		"at": `at = at + 1`, "actor": `actor = 'user:mallory'`, "action": `action = 'nodes.restrict'`,
		"resource": `resource = 'node/other'`, "outcome": `outcome = 'denied'`, "request_id": `request_id = 'req-forged'`,
		"caller": `caller = '10.9.9.9'`, "details": `details = '{"i": 99}'`,
	} {
		t.Run(col, func(t *testing.T) {
			storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
				f := newFixture(t, db, 4)
				ids := f.record(t, iam.RootTenant, 6)
				f.seal(t, iam.RootTenant)
				f.exec(t, `UPDATE audit_events SET `+set+` WHERE id = $1`, ids[2])
				if got, want := f.verify(t, iam.RootTenant), []string{"row-edited seq=2 event=" + ids[2]}; !slices.Equal(got, want) {
					t.Fatalf("findings after editing %s:\n got  %q\n want %q", col, got, want)
				}
			})
		})
	}
}

// TestConcurrentWritersAndSealers runs writers and sealers at once and
// checks that seqs are dense, in the order rows became visible, and that
// every checkpoint is consistent with the one before. On PostgreSQL a long
// transaction that began before a seal and committed after it gets a seq
// after that seal's checkpoint.
func TestConcurrentWritersAndSealers(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		f := newFixture(t, db, 7)
		const writers, perWriter, sealers = 4, 25, 3

		var longSeqAfter int64 = -1
		longDone := make(chan string, 1)
		if db.Dialect == store.Postgres {
			// A long transaction: insert, let a seal complete, then commit.
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := audit.Record(ctx, tx, t0.Add(-time.Hour), audit.Entry{TenantID: iam.RootTenant, Actor: "user:slow", Action: "a", Resource: "r", Outcome: "allowed"}); err != nil {
				t.Fatal(err)
			}
			f.record(t, iam.RootTenant, 3)
			res := f.seal(t, iam.RootTenant)
			longSeqAfter = res[len(res)-1].Size
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			longDone <- "user:slow"
		}

		var wg sync.WaitGroup
		errc := make(chan error, writers+sealers)
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < perWriter; i++ {
					err := db.Tx(ctx, func(tx *sql.Tx) error {
						return audit.Record(ctx, tx, f.clk.Now(), audit.Entry{TenantID: iam.RootTenant, Actor: fmt.Sprintf("w%d", w), Action: "a", Resource: fmt.Sprint(i), Outcome: "allowed"})
					})
					if err != nil {
						errc <- err
						return
					}
				}
			}(w)
		}
		stop := make(chan struct{})
		var sw sync.WaitGroup
		for s := 0; s < sealers; s++ {
			sw.Add(1)
			go func() {
				defer sw.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := f.log.Seal(ctx, iam.RootTenant, f.key); err != nil {
						errc <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(stop)
		sw.Wait()
		close(errc)
		for err := range errc {
			t.Fatalf("concurrent: %v", err)
		}
		f.seal(t, iam.RootTenant)

		var seqs []int64
		rows, err := db.QueryContext(ctx, `SELECT seq FROM audit_events WHERE tenant_id = 'root' ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s sql.NullInt64
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			if !s.Valid {
				t.Fatal("a committed row is unsealed after the final seal")
			}
			seqs = append(seqs, s.Int64)
		}
		rows.Close()
		want := writers * perWriter
		if db.Dialect == store.Postgres {
			want += 4
		}
		if len(seqs) != want {
			t.Fatalf("%d rows sealed, want %d", len(seqs), want)
		}
		for i, s := range seqs {
			if s != int64(i) {
				t.Fatalf("seq %d at position %d: not dense", s, i)
			}
		}
		if got := f.verify(t, iam.RootTenant); len(got) != 0 {
			t.Fatalf("findings after concurrent sealing: %v", got)
		}
		if db.Dialect == store.Postgres {
			actor := <-longDone
			var seq int64
			if err := db.QueryRowContext(ctx, `SELECT seq FROM audit_events WHERE actor = $1`, actor).Scan(&seq); err != nil {
				t.Fatal(err)
			}
			if seq < longSeqAfter {
				t.Fatalf("long transaction's row got seq %d, behind the checkpoint of size %d sealed before it committed", seq, longSeqAfter)
			}
		}
	})
}

func TestSelfCheckWarnsOnStaleRows(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		f := newFixture(t, db, 100)
		reg := prometheus.NewRegistry()
		m, err := auditlog.NewMetrics(reg)
		if err != nil {
			t.Fatal(err)
		}
		var logBuf strings.Builder
		w := &auditlog.Worker{Log: f.log, Key: f.key, Metrics: m, Clock: f.clk, Logger: slog.New(slog.NewTextHandler(&logBuf, nil))}
		f.record(t, iam.RootTenant, 3)
		f.clk.Advance(3*time.Hour - time.Minute)
		u, err := w.SelfCheck(ctx)
		if err != nil || u.Stale != 0 || testutil.ToFloat64(m.StaleRows) != 0 || strings.Contains(logBuf.String(), "unsealed") {
			t.Fatalf("before 3h: %+v %v stale=%v log=%q", u, err, testutil.ToFloat64(m.StaleRows), logBuf.String())
		}
		f.clk.Advance(2 * time.Minute)
		u, err = w.SelfCheck(ctx)
		if err != nil || u.Stale != 3 || testutil.ToFloat64(m.StaleRows) != 3 || !strings.Contains(logBuf.String(), "audit rows unsealed for over 3 hours") {
			t.Fatalf("after 3h: %+v %v stale=%v log=%q", u, err, testutil.ToFloat64(m.StaleRows), logBuf.String())
		}
		// The warning is the documented metric, on the registry given.
		if n, err := testutil.GatherAndCount(reg, "bc_audit_unsealed_stale_rows"); err != nil || n != 1 {
			t.Fatalf("bc_audit_unsealed_stale_rows on the registry: %d series (%v), want 1", n, err)
		}
		if age := testutil.ToFloat64(m.OldestUnsealed); age < (3 * time.Hour).Seconds() {
			t.Fatalf("oldest unsealed age %v", age)
		}
		if err := w.SealOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if u, err = w.SelfCheck(ctx); err != nil || u.Stale != 0 || testutil.ToFloat64(m.StaleRows) != 0 {
			t.Fatalf("after seal: %+v %v", u, err)
		}
	})
}

// TestCheckpointsCarryConsistencyProofs reads what the sealer stored: each
// checkpoint is a signed note under the audit key (the verifier opens it,
// another key does not), its text is the exact C2SP checkpoint for the
// tenant's origin, it names its predecessor, and the stored consistency
// proof proves the predecessor's signed root is a prefix of its own; a
// stored proof edited afterwards is named checkpoint-inconsistent.
func TestCheckpointsCarryConsistencyProofs(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		f := newFixture(t, db, 4)
		f.record(t, iam.RootTenant, 11)
		f.seal(t, iam.RootTenant) // checkpoints at 4, 8, 11
		other, err := auditlog.NewSigningKey(deployment, seedKey(3))
		if err != nil {
			t.Fatal(err)
		}
		rows, err := db.QueryContext(ctx, `SELECT size, prev_size, note, consistency FROM audit_checkpoints WHERE tenant_id = 'root' ORDER BY size`)
		if err != nil {
			t.Fatal(err)
		}
		type stored struct {
			size, prev int64
			note, cons []byte
		}
		var cps []stored
		for rows.Next() {
			var s stored
			if err := rows.Scan(&s.size, &s.prev, &s.note, &s.cons); err != nil {
				t.Fatal(err)
			}
			cps = append(cps, s)
		}
		rows.Close()
		if len(cps) != 3 {
			t.Fatalf("%d checkpoints, want 3", len(cps))
		}
		var prevSize uint64
		var prevRoot []byte
		for i, s := range cps {
			n, err := note.Open(s.note, note.VerifierList(f.v))
			if err != nil {
				t.Fatalf("checkpoint %d does not open under the audit key: %v", s.size, err)
			}
			if _, err := note.Open(s.note, note.VerifierList(other.Verifier)); err == nil {
				t.Fatalf("checkpoint %d opens under another key", s.size)
			}
			cp, err := auditlog.ParseCheckpoint([]byte(n.Text))
			if err != nil || cp.Origin != auditlog.Origin(deployment, iam.RootTenant) || cp.Origin != "test.bc.local/audit/root" || cp.Size != uint64(s.size) {
				t.Fatalf("checkpoint %d: %+v %v", s.size, cp, err)
			}
			if want := fmt.Sprintf("%s\n%d\n%s\n", cp.Origin, cp.Size, base64.StdEncoding.EncodeToString(cp.Root)); n.Text != want {
				t.Fatalf("checkpoint text %q, want the C2SP form %q", n.Text, want)
			}
			if uint64(s.prev) != prevSize {
				t.Fatalf("checkpoint %d names predecessor %d, want %d", s.size, s.prev, prevSize)
			}
			var hashes [][]byte
			for b := s.cons; len(b) > 0; b = b[32:] {
				if len(b) < 32 {
					t.Fatalf("checkpoint %d: consistency proof of %d bytes", s.size, len(s.cons))
				}
				hashes = append(hashes, b[:32])
			}
			if i == 0 {
				if len(hashes) != 0 {
					t.Fatalf("the first checkpoint stores a consistency proof of %d hashes", len(hashes))
				}
			} else if err := proof.VerifyConsistency(rfc6962.DefaultHasher, prevSize, cp.Size, hashes, prevRoot, cp.Root); err != nil || len(hashes) == 0 {
				t.Fatalf("checkpoint %d: stored consistency proof from %d does not verify (%d hashes): %v", s.size, prevSize, len(hashes), err)
			}
			prevSize, prevRoot = cp.Size, cp.Root
		}
		bad := bytes.Clone(cps[1].cons)
		bad[0] ^= 1
		f.exec(t, `UPDATE audit_checkpoints SET consistency = $1 WHERE tenant_id = 'root' AND size = 8`, bad)
		got := f.verify(t, iam.RootTenant)
		if len(got) != 1 || !strings.HasPrefix(got[0], "checkpoint-inconsistent size=8 ") {
			t.Fatalf("findings after editing the stored consistency proof: %q", got)
		}
	})
}

// TestVerifyHeldFindsARollback: a writer of the database who rolls the log
// back past its last checkpoint (that checkpoint, its rows and tree nodes
// deleted, the log state restored from a copy) leaves a log that verifies
// clean on its own, and after the next honest seal the real key has
// signed a second checkpoint of the same size (a fork). Verified against
// the checkpoint held from the verify before, the first is
// log-rolled-back and the second checkpoint-forked.
func TestVerifyHeldFindsARollback(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		f := newFixture(t, db, 4)
		f.record(t, iam.RootTenant, 8)
		f.seal(t, iam.RootTenant) // checkpoints at 4 and 8
		var size int64
		var compactBlob []byte
		if err := db.QueryRowContext(ctx, `SELECT size, compact FROM audit_log_state WHERE tenant_id = 'root'`).Scan(&size, &compactBlob); err != nil {
			t.Fatal(err)
		}
		f.record(t, iam.RootTenant, 4)
		f.seal(t, iam.RootTenant) // and at 12
		rep, err := f.log.Verify(ctx, iam.RootTenant, f.v, nil)
		if err != nil || !rep.OK() {
			t.Fatalf("before: %+v %v", rep, err)
		}
		held, err := auditlog.OpenCheckpoint(rep.Latest, f.v, rep.Origin)
		if err != nil || held.Size != 12 {
			t.Fatalf("the latest checkpoint: %+v %v, want size 12", held, err)
		}
		verifyHeld := func() []string {
			t.Helper()
			rep, err := f.log.VerifyHeld(ctx, iam.RootTenant, f.v, []auditlog.Checkpoint{held}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, fd := range rep.Findings {
				out = append(out, fd.String())
			}
			return out
		}
		if got := verifyHeld(); len(got) != 0 {
			t.Fatalf("untouched log against its own checkpoint: %q", got)
		}

		f.exec(t, `DELETE FROM audit_checkpoints WHERE tenant_id = 'root' AND size = 12`)
		f.exec(t, `DELETE FROM audit_events WHERE tenant_id = 'root' AND seq >= 8`)
		f.exec(t, `DELETE FROM audit_log_nodes WHERE tenant_id = 'root' AND (idx << level) >= 8`)
		f.exec(t, `UPDATE audit_log_state SET size = $1, compact = $2 WHERE tenant_id = 'root'`, size, compactBlob)
		if got := f.verify(t, iam.RootTenant); len(got) != 0 {
			t.Fatalf("the rolled-back log on its own: %q (a shorter consistent log verifies)", got)
		}
		want := []string{"log-rolled-back size=12 (the log's size 8 is below a checkpoint held)"}
		if got := verifyHeld(); !slices.Equal(got, want) {
			t.Fatalf("rolled back, against the held checkpoint:\n got  %q\n want %q", got, want)
		}

		f.record(t, iam.RootTenant, 4)
		f.seal(t, iam.RootTenant) // a second checkpoint of size 12
		if got := f.verify(t, iam.RootTenant); len(got) != 0 {
			t.Fatalf("the forked log on its own: %q", got)
		}
		want = []string{"checkpoint-forked size=12 (the log's checkpoint of this size has another root than the one held: rolled back and sealed again)"}
		if got := verifyHeld(); !slices.Equal(got, want) {
			t.Fatalf("forked, against the held checkpoint:\n got  %q\n want %q", got, want)
		}
	})
}

// TestVerifyIsOneSnapshot: a seal that commits while verify reads (here
// from verify's progress callback, after the rows and before the rows past
// the log's size are read) is not seen: its rows are not taken for rows
// numbered past the log, and the next verify sees them sealed.
func TestVerifyIsOneSnapshot(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		f := newFixture(t, db, 4)
		f.record(t, iam.RootTenant, 8)
		f.seal(t, iam.RootTenant)
		f.record(t, iam.RootTenant, 4)
		sealed := false
		rep, err := f.log.Verify(ctx, iam.RootTenant, f.v, func(done, total int64) {
			if !sealed {
				sealed = true
				f.seal(t, iam.RootTenant)
			}
		})
		if err != nil || !sealed {
			t.Fatalf("verify: %v (sealed during it: %v)", err, sealed)
		}
		if !rep.OK() || rep.Size != 8 {
			t.Fatalf("verify during a seal: size %d, findings %v; want size 8 and none", rep.Size, rep.Findings)
		}
		if got := f.verify(t, iam.RootTenant); len(got) != 0 {
			t.Fatalf("verify after: %q", got)
		}
	})
}
