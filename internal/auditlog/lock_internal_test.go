package auditlog

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"log/slog"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// TestSealWaitsForTheTenantStateLock forces the interleaving the log
// state's row lock exists for, on PostgreSQL: another sealer of the
// tenant has opened its log state (as sealBatch does) and not committed.
// A seal must wait for it (PostgreSQL's lock table shows it blocked by
// that sealer) and finish only after it ends, so two sealers never number
// rows from the same size. Without the lock the seal finishes while the
// other sealer is still open, and the test fails on that, with no timing
// involved.
func TestSealWaitsForTheTenantStateLock(t *testing.T) {
	db := storetest.NewTestPostgres(t)
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	l, err := New(Config{DB: db, Deployment: "test.bc.local", Clock: clk, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	key, err := NewSigningKey("test.bc.local", ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)))
	if err != nil {
		t.Fatal(err)
	}
	record := func() {
		clk.Advance(time.Millisecond)
		if err := db.Tx(ctx, func(tx *sql.Tx) error {
			return audit.Record(ctx, tx, clk.Now(), audit.Entry{TenantID: iam.RootTenant, Actor: "user:alice", Action: "a", Resource: "r", Outcome: "allowed"})
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The tenant's log state exists (a first seal), and a row waits.
	record()
	if _, err := l.Seal(ctx, iam.RootTenant, key); err != nil {
		t.Fatal(err)
	}
	record()

	other, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback() }() // on a failure, before the schema is dropped
	otherPID := storetest.BackendPID(t, other)
	if _, _, _, err := l.openState(ctx, other, iam.RootTenant, clk.Now().UnixMilli(), key.Verifier); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := l.Seal(ctx, iam.RootTenant, key)
		done <- err
	}()
	storetest.WaitBlockedBy(t, db, otherPID, storetest.Finished(done), "the seal finished while another sealer held the tenant's log state: sealers are not serialised")
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the seal after the other sealer ended: %v", err)
	}
	rep, err := l.Verify(ctx, iam.RootTenant, key.Verifier, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Size != 2 {
		t.Fatalf("log size %d after both rows were sealed, want 2 (report %+v)", rep.Size, rep)
	}
}
