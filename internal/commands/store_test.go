package commands

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// seedCommand writes a queued command of the root tenant on nodeID,
// expiring at exp, and returns it.
func seedCommand(t *testing.T, s *Store, nodeID, batchID string, payload string, now time.Time, exp time.Duration) Command {
	t.Helper()
	c := newCommand(audit.Entry{Actor: "test"}, nodeID, iam.RootTenant, "diag.run", json.RawMessage(payload), now, exp)
	c.BatchID = batchID
	if err := s.tx(context.Background(), func(tx *sql.Tx) error { return s.insert(context.Background(), tx, c) }); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestStoreLivePayload: the broker's read answers only a live, unexpired
// command of the named node.
func TestStoreLivePayload(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		s := NewStore(db)
		now := time.UnixMilli(1_800_000_000_000)
		live := seedCommand(t, s, "n1", "", `{"ref":"secret://root/x"}`, now, time.Minute)
		done := seedCommand(t, s, "n1", "", `{}`, now, time.Minute)
		if err := s.cancel(ctx, done.ID, "test", now); err != nil {
			t.Fatal(err)
		}
		tenant, payload, ok, err := s.LivePayload(ctx, "n1", live.ID, now)
		if err != nil || !ok || tenant != iam.RootTenant || string(payload) != `{"ref":"secret://root/x"}` {
			t.Fatalf("live: %q %q %v %v", tenant, payload, ok, err)
		}
		for name, c := range map[string]struct {
			node, id string
			at       time.Time
		}{
			"other node": {"n2", live.ID, now},
			"expired":    {"n1", live.ID, now.Add(time.Minute)},
			"cancelled":  {"n1", done.ID, now},
			"unknown":    {"n1", "c-none", now},
		} {
			if _, _, ok, err := s.LivePayload(ctx, c.node, c.id, c.at); ok || err != nil {
				t.Errorf("%s: ok %v err %v, want none", name, ok, err)
			}
		}
	})
}

// TestStoreSignatures: Unsigned lists queued unsigned commands oldest
// first; StoreSignatures signs only those still queued and unsigned,
// across statements, and names the node of each one it signed.
func TestStoreSignatures(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		s := NewStore(db)
		now := time.UnixMilli(1_800_000_000_000)
		var cs []Command
		for i := range signPerStmt + 5 {
			cs = append(cs, seedCommand(t, s, fmt.Sprintf("n%d", i%3), "", `{}`, now.Add(time.Duration(i)*time.Millisecond), time.Hour))
		}
		batched := seedCommand(t, s, "n9", "b-1", `{}`, now.Add(time.Hour), time.Hour)
		if err := s.cancel(ctx, cs[1].ID, "test", now); err != nil {
			t.Fatal(err)
		}
		un, err := s.Unsigned(ctx, 3)
		if err != nil || len(un) != 3 || un[0].ID != cs[0].ID || un[1].ID != cs[2].ID || un[0].ExpiresAtMs != cs[0].ExpiresAt.UnixMilli() {
			t.Fatalf("unsigned: %+v %v", un, err)
		}
		un, err = s.Unsigned(ctx, 1000)
		if err != nil || len(un) != len(cs) || un[len(un)-1].ID != batched.ID || un[len(un)-1].BatchID != "b-1" {
			t.Fatalf("unsigned: %d %v", len(un), err)
		}
		var sigs []Signature
		var want []string
		for _, c := range cs {
			sigs = append(sigs, Signature{CommandID: c.ID, Body: []byte("body-" + c.ID), Sig: []byte("sig")})
			if c.ID != cs[1].ID {
				want = append(want, c.NodeID)
			}
		}
		got, err := s.StoreSignatures(ctx, sigs, []byte("cert"), now)
		slices.Sort(got)
		slices.Sort(want)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("signed nodes %d %v, want %d", len(got), err, len(want))
		}
		again, err := s.StoreSignatures(ctx, sigs[:2], []byte("cert2"), now)
		if err != nil || len(again) != 0 {
			t.Fatalf("signed again: %v %v", again, err)
		}
		un, err = s.Unsigned(ctx, 1000)
		if err != nil || len(un) != 1 || un[0].ID != batched.ID {
			t.Fatalf("left unsigned: %+v %v", un, err)
		}
		pending, err := s.pendingNodes(ctx)
		slices.Sort(pending)
		if err != nil || !slices.Equal(pending, []string{"n0", "n1", "n2"}) {
			t.Fatalf("pending nodes %q %v", pending, err)
		}
	})
}

// TestStoreListScope: List shows a scope its own tenant's commands, the
// root tenant every command, and the zero scope none.
func TestStoreListScope(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		s := NewStore(db)
		now := time.UnixMilli(1_800_000_000_000)
		c := seedCommand(t, s, "n1", "", `{}`, now, time.Hour)
		for scope, want := range map[iam.Scope]int{iam.RootScope(): 1, iam.ScopeOf("acme"): 0, {}: 0} {
			got, err := s.list(ctx, scope, Filter{}.normalized())
			if err != nil || len(got) != want {
				t.Errorf("scope %q: %d %v, want %d", scope.Tenant, len(got), err, want)
			}
		}
		got, err := s.list(ctx, iam.RootScope(), Filter{NodeID: "n1", State: string(StateQueued), Limit: 10})
		if err != nil || len(got) != 1 || got[0].ID != c.ID || got[0].State != StateQueued || string(got[0].Payload) != `{}` {
			t.Errorf("filtered: %+v %v", got, err)
		}
		if got, err := s.list(ctx, iam.RootScope(), Filter{State: "bogus", Limit: 10}); err != nil || len(got) != 0 {
			t.Errorf("unknown state: %+v %v", got, err)
		}
	})
}

// sentRow reads command id's state and the session it is recorded sent on.
func sentRow(t *testing.T, db *store.DB, id string) (string, string) {
	t.Helper()
	var st string
	var session sql.NullString
	if err := db.QueryRowContext(context.Background(), `SELECT state, sent_session FROM commands WHERE id = $1`, id).Scan(&st, &session); err != nil {
		t.Fatal(err)
	}
	return st, session.String
}

// TestStoreRequeueSent replays issue 23 item 5 at the table: a command
// recorded sent on a session that ended (or that the node's next Hello
// superseded) with nothing reported by the node goes back to queued; one
// the node reported on (running, finished), one cancelled, one past its
// expiry, one sent on another session, and one never sent stay as they
// are. MarkSent never moves a command already sent to another session. A
// requeued command keeps the session it was sent on: its node may have
// it, so an operator's cancel refuses it and the expiry sweep gives it a
// sent command's grace.
func TestStoreRequeueSent(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		s := NewStore(db)
		now := time.UnixMilli(1_800_000_000_000)
		later := now.Add(2 * time.Minute)
		mk := func(exp time.Duration) string { return seedCommand(t, s, "n1", "", `{}`, now, exp).ID }
		lost, running, done, cancelled, expired, other, queued, current, legacy := mk(time.Hour), mk(time.Hour), mk(time.Hour),
			mk(time.Hour), mk(time.Minute), mk(time.Hour), mk(time.Hour), mk(time.Hour), mk(time.Hour)
		var sent []wire.Sent
		for _, id := range []string{lost, running, done, cancelled, expired} {
			sent = append(sent, wire.Sent{CommandID: id, SessionID: "s1"})
		}
		sent = append(sent, wire.Sent{CommandID: other, SessionID: "s2"}, wire.Sent{CommandID: current, SessionID: "s3"}, wire.Sent{CommandID: legacy, SessionID: "s1"})
		if err := s.markSent(ctx, sent, now); err != nil {
			t.Fatal(err)
		}
		if err := s.markSent(ctx, []wire.Sent{{CommandID: other, SessionID: "s9"}}, now); err != nil {
			t.Fatal(err)
		}
		for q, id := range map[string]string{
			`UPDATE commands SET state = 'running' WHERE id = $1`:                    running,
			`UPDATE commands SET state = 'succeeded', result = 'x' WHERE id = $1`:    done,
			`UPDATE commands SET sent_session = NULL WHERE id = $1`:                  legacy,
			`UPDATE commands SET state = 'cancelled', reason = 'user' WHERE id = $1`: cancelled,
		} {
			if _, err := db.ExecContext(ctx, q, id); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := s.requeueEnded(ctx, []string{"s1"}, later); err != nil || n != 1 {
			t.Fatalf("requeue ended: %d %v, want 1", n, err)
		}
		want := map[string][2]string{lost: {"queued", "s1"}, running: {"running", "s1"}, done: {"succeeded", "s1"}, cancelled: {"cancelled", "s1"},
			expired: {"sent", "s1"}, other: {"sent", "s2"}, queued: {"queued", ""}, current: {"sent", "s3"}, legacy: {"sent", ""}}
		check := func(when string) {
			t.Helper()
			for id, w := range want {
				if st, session := sentRow(t, db, id); st != w[0] || session != w[1] {
					t.Errorf("%s: %s is %s on %q, want %s on %q", when, id, st, session, w[0], w[1])
				}
			}
		}
		check("after the session ended")
		// The node's Hello for session s3 supersedes s2 and the unknown one.
		if n, err := s.requeueNode(ctx, "n1", "s3", later); err != nil || n != 2 {
			t.Fatalf("requeue node: %d %v, want 2", n, err)
		}
		want[other], want[legacy] = [2]string{"queued", "s2"}, [2]string{"queued", ""}
		check("after the next Hello")
		if n, err := s.requeueNode(ctx, "n2", "s4", later); err != nil || n != 0 {
			t.Fatalf("another node's Hello requeued %d %v", n, err)
		}
		for id, want := range map[string]int64{lost: 0, queued: 1} {
			res, err := db.ExecContext(ctx, sqlCancelQueued, "cancelled", ReasonOperatorCancelled, later.UnixMilli(), id, "queued")
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := res.RowsAffected(); n != want {
				t.Errorf("operator cancel of %s: %d rows, want %d", id, n, want)
			}
		}
		// Within the grace after lost's expiry it stays queued; after it,
		// the sweep cancels it.
		exp := now.Add(time.Hour)
		if _, err := s.sweep(ctx, exp.Add(time.Second), exp.Add(time.Second-SentGrace)); err != nil {
			t.Fatal(err)
		}
		if st, _ := sentRow(t, db, lost); st != "queued" {
			t.Fatalf("requeued command within the grace: %s, want queued", st)
		}
		if _, err := s.sweep(ctx, exp.Add(SentGrace+time.Second), exp.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		if st, _ := sentRow(t, db, lost); st != "cancelled" {
			t.Fatalf("requeued command past the grace: %s, want cancelled", st)
		}
	})
}
