package secrets

import (
	"context"
	"log/slog"
	"testing"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// TestPutWaitsForTheReferenceLock forces the interleaving the
// per-reference lock exists for, on PostgreSQL: another writer of the
// reference holds its lock (taken as Put takes it) and has not committed.
// A put must wait for it (PostgreSQL's lock table shows it blocked by that
// writer) and may finish only after it ends, so two writers never read
// the same latest version. Without the lock the put finishes while the
// other writer still holds it, and the test fails on that, with no timing
// involved.
func TestPutWaitsForTheReferenceLock(t *testing.T) {
	db := storetest.NewTestPostgres(t)
	ctx := context.Background()
	s := New(db, clock.NewFake(testNow), rekeyTestKEK(1), nil, nil, nil, nil, slog.New(slog.DiscardHandler))
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback() }() // on a failure, before the schema is dropped
	holderPID := storetest.BackendPID(t, holder)
	if err := s.lockRef(ctx, holder, Ref(iam.RootTenant, "held")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Put(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "test"}, iam.RootTenant, "held", ScopeTenant, []byte("v"))
		done <- err
	}()
	storetest.WaitBlockedBy(t, db, holderPID, storetest.Finished(done), "the put finished while another writer held the reference's lock: writers are not serialised")
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the put after the other writer ended: %v", err)
	}
}
