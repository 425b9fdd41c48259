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
