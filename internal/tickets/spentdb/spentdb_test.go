package spentdb_test

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/signing"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/tickets"
	"github.com/bettercompute/bettercompute/internal/tickets/spentdb"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// noBatches approves no batch (the signer needs a quorum gate).
type noBatches struct{}

func (noBatches) Approved(context.Context, string) (bool, error) { return false, nil }

// TestRedeemOnceAcrossGateways checks single use with the database store
// on each dialect, end to end: a ticket the workers signed is accepted
// once, then refused as spent, also by a second gateway (another
// verifier, another handle on the same database).
func TestRedeemOnceAcrossGateways(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		now := time.Now()
		kek, err := pki.CreateKEK(filepath.Join(t.TempDir(), "kek"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := pki.Init(filepath.Join(t.TempDir(), "pki"), "tickets.bc.local", kek, clock.NewFake(now.Add(-48*time.Hour)))
		if err != nil {
			t.Fatal(err)
		}
		rk, err := b.CommandRootKey(kek)
		if err != nil {
			t.Fatal(err)
		}
		s := signing.New(signing.Deps{DB: db, Commands: commands.NewStore(db), Clock: clock.NewFake(now), KEK: kek, Root: b.CommandRoot, RootKey: rk,
			TrustDomain: b.TrustDomain, Bus: bus.New(), Batches: noBatches{}, Log: slog.New(slog.DiscardHandler)})
		st, err := s.SignTicket(ctx, &nodev1.TicketBody{Jti: "tk_db", NodeId: "n_nodea", Port: 22, Action: tickets.ActionNodeTunnel,
			TenantId: "t_tenant", Caller: "identity/alice", IssuedAtMs: now.UnixMilli(), ExpiresAtMs: now.Add(tickets.Lifetime).UnixMilli()})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := proto.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		want := tickets.Want{NodeID: "n_nodea", Port: 22, Actions: []string{tickets.ActionNodeTunnel}}
		gw1 := &tickets.Verifier{Roots: func() []*x509.Certificate { return []*x509.Certificate{b.CommandRoot} }, TrustDomain: b.TrustDomain}
		gw2 := &tickets.Verifier{Roots: gw1.Roots, TrustDomain: b.TrustDomain, WorkerChains: pki.NewWorkerChainCache(0)}
		if got, r := gw1.Redeem(ctx, raw, now, want, spentdb.New(db)); r != "" || got.GetJti() != "tk_db" {
			t.Fatalf("first use: %v %q, want accepted", got, r)
		}
		if got, r := gw1.Redeem(ctx, raw, now, want, spentdb.New(db)); r != tickets.ReasonSpent || got != nil {
			t.Fatalf("second use: %v %q, want %q", got, r, tickets.ReasonSpent)
		}
		if _, r := gw2.RedeemSigned(ctx, st, now.Add(time.Second), want, spentdb.New(db)); r != tickets.ReasonSpent {
			t.Fatalf("second use on another gateway: %q, want %q", r, tickets.ReasonSpent)
		}
	})
}

// TestSpendAndSweep checks the store itself on each dialect: a jti is
// spent once; Sweep deletes only the jtis whose tickets expired more
// than Retention ago (the boundary one stays spent), after which such a
// jti could be inserted again (Verify refuses its ticket as expired).
func TestSpendAndSweep(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		s := spentdb.New(db)
		old, edge, live := t0.Add(-time.Minute), t0.Add(-tickets.Retention), t0.Add(time.Minute)
		for jti, exp := range map[string]time.Time{"tk_old": old, "tk_edge": edge, "tk_live": live} {
			if err := s.Spend(ctx, jti, exp); err != nil {
				t.Fatal(err)
			}
			if err := s.Spend(ctx, jti, exp); !errors.Is(err, tickets.ErrSpent) {
				t.Fatalf("second spend of %s: %v, want ErrSpent", jti, err)
			}
		}
		n, err := s.Sweep(ctx, t0)
		if err != nil || n != 1 {
			t.Fatalf("sweep: %d %v, want 1 deleted", n, err)
		}
		for jti, exp := range map[string]time.Time{"tk_edge": edge, "tk_live": live} {
			if err := s.Spend(ctx, jti, exp); !errors.Is(err, tickets.ErrSpent) {
				t.Fatalf("%s after the sweep: %v, want still spent", jti, err)
			}
		}
		if err := s.Spend(ctx, "tk_old", old); err != nil {
			t.Fatalf("tk_old after the sweep: %v, want swept", err)
		}
	})
}

// TestSpendFailsClosed checks that a database that cannot record the
// jti answers an error that is not ErrSpent (Redeem refuses on any error:
// tickets.TestRedeemFailsClosed).
func TestSpendFailsClosed(t *testing.T) {
	db := storetest.NewTestSQLite(t)
	s := spentdb.New(db)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	err := s.Spend(context.Background(), "tk_x", t0)
	if err == nil || errors.Is(err, tickets.ErrSpent) {
		t.Fatalf("spend on a closed database: %v, want a store error", err)
	}
}

// TestConcurrentSpendOneWins checks, on each dialect, that of many
// concurrent spends of one jti exactly one succeeds and the rest are
// ErrSpent.
func TestConcurrentSpendOneWins(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		s := spentdb.New(db)
		const n = 16
		start := make(chan struct{})
		out := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				out[i] = s.Spend(context.Background(), "tk_race", t0)
			}()
		}
		close(start)
		wg.Wait()
		ok := 0
		for _, err := range out {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, tickets.ErrSpent):
				t.Fatalf("concurrent spend: %v", err)
			}
		}
		if ok != 1 {
			t.Fatalf("%d concurrent spends of one jti succeeded, want exactly 1", ok)
		}
	})
}

// TestSpendWaitsForTheOtherSpender forces, on PostgreSQL, the
// interleaving the primary key decides: another gateway's transaction has
// inserted the jti and not committed. A spend must wait for it
// (PostgreSQL shows it blocked by that transaction) and, once it commits,
// be refused as spent. Without the key the spend finishes at once and
// succeeds, and the test fails on that with no timing involved.
func TestSpendWaitsForTheOtherSpender(t *testing.T) {
	db := storetest.NewTestPostgres(t)
	ctx := context.Background()
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback() }()
	holderPID := storetest.BackendPID(t, holder)
	if _, err := holder.ExecContext(ctx, `INSERT INTO tickets_spent (jti, expires_at_ms) VALUES ($1, $2)`, "tk_held", t0.UnixMilli()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- spentdb.New(db).Spend(ctx, "tk_held", t0) }()
	storetest.WaitBlockedBy(t, db, holderPID, storetest.Finished(done), "the spend finished while another spender's insert of the jti was uncommitted")
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, tickets.ErrSpent) {
		t.Fatalf("the spend after the other spender committed: %v, want ErrSpent", err)
	}
}
