package commands

import (
	"context"
	"database/sql"
	"log/slog"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// noCertificates is a fleet that knows no certificate: every update is
// recorded, none attested. The tests here are about how updates reach the
// database, not about attestation.
type noCertificates struct{}

func (noCertificates) CertStates(context.Context, []string) (map[string]nodes.CertState, error) {
	return map[string]nodes.CertState{}, nil
}

func (noCertificates) TenantRoles(context.Context, []string) (map[string]nodes.TenantRole, error) {
	return map[string]nodes.TenantRole{}, nil
}

// lockScene is two sent commands of node n1 on PostgreSQL, ids lo < hi,
// and a transaction holding lo's row lock as marking sent takes it (in id
// order), with deadlock detection left to the other side.
type lockScene struct {
	db         *store.DB
	s          *Store
	lo, hi     string
	other      *sql.Tx
	otherPID   int
	updateItem func(id, state string) UpdateItem
}

func newLockScene(t *testing.T) *lockScene {
	t.Helper()
	ctx := context.Background()
	db := storetest.NewTestPostgres(t)
	s := NewStore(db)
	now := time.UnixMilli(1_800_000_000_000)
	a := seedCommand(t, s, "n1", "", `{}`, now, time.Hour)
	b := seedCommand(t, s, "n1", "", `{}`, now, time.Hour)
	if _, err := db.ExecContext(ctx, `UPDATE commands SET state = 'sent'`); err != nil {
		t.Fatal(err)
	}
	ids := slices.Sorted(slices.Values([]string{a.ID, b.ID}))
	sc := &lockScene{db: db, s: s, lo: ids[0], hi: ids[1]}
	other, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Rollback() })
	sc.other = other
	// Only the results write may be chosen as a deadlock's victim: this
	// side never runs PostgreSQL's detector within the test.
	if _, err := other.ExecContext(ctx, `SET LOCAL deadlock_timeout = '1h'`); err != nil {
		t.Fatal(err)
	}
	if err := other.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&sc.otherPID); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ExecContext(ctx, `SELECT id FROM commands WHERE id = $1 FOR UPDATE`, sc.lo); err != nil {
		t.Fatal(err)
	}
	sc.updateItem = func(id, state string) UpdateItem {
		body, err := proto.Marshal(&nodev1.UpdateBody{CommandId: id, NodeId: "n1", State: state, Result: []byte(`{"ok":true}`)})
		if err != nil {
			t.Fatal(err)
		}
		return UpdateItem{NodeID: "n1", Update: &nodev1.CommandUpdate{Body: body, NodeSig: []byte("sig"), CertSerial: "serial"}}
	}
	return sc
}

// blockedPID waits until a backend waits for a lock the other
// transaction holds and returns its process id. PostgreSQL's own lock
// table is the signal: no sleep, no timing.
func (sc *lockScene) blockedPID(ctx context.Context, t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var pid int
		err := sc.db.QueryRowContext(ctx, `SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, sc.otherPID).Scan(&pid)
		if err == nil {
			return pid
		}
		if ctx.Err() != nil || err != sql.ErrNoRows {
			t.Fatalf("waiting for the results write to block: %v", err)
		}
	}
}

// TestResultsWriteDoesNotDeadlockWithMarkSent reproduces the deadlock of
// a results batch against marking commands sent, on PostgreSQL: marking
// sent locks rows in id order; results arrive in any order. Here another
// transaction holds lo (as marking sent does first), the results batch
// names hi then lo, and once the batch waits, the other transaction
// locks hi too. Writing results in arrival order held hi while waiting
// for lo, so the two waited on each other and PostgreSQL cancelled the
// results (40P01, the node's results dropped); locking in id order, the
// batch holds nothing while it waits for lo, the other transaction gets
// hi and commits, and the results are recorded.
func TestResultsWriteDoesNotDeadlockWithMarkSent(t *testing.T) {
	ctx := context.Background()
	sc := newLockScene(t)
	svc := &Service{store: sc.s, clk: clock.NewFake(time.UnixMilli(1_800_000_000_000)), bus: bus.New(), nodes: noCertificates{},
		log: slog.New(slog.DiscardHandler)}
	items := []UpdateItem{sc.updateItem(sc.hi, "succeeded"), sc.updateItem(sc.lo, "failed")}
	todo := make([]updateTodo, len(items))
	for i, it := range items {
		body, err := checkUpdate(it.NodeID, it.Update)
		if err != nil {
			t.Fatal(err)
		}
		todo[i] = updateTodo{i: i, body: body}
	}
	out := make([]UpdateResult, len(items))
	done := make(chan error, 1)
	go func() {
		// writeUpdates alone: no retry, so only the lock order can save it.
		_, err := svc.writeUpdates(ctx, items, todo, out)
		done <- err
	}()
	sc.blockedPID(ctx, t)
	if _, err := sc.other.ExecContext(ctx, `SELECT id FROM commands WHERE id = $1 FOR UPDATE`, sc.hi); err != nil {
		t.Fatalf("other transaction locking hi: %v", err)
	}
	if err := sc.other.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("results write refused: %v (deadlock: it locked rows in arrival order)", err)
	}
	for i, want := range []string{"succeeded", "failed"} {
		if out[i].State != want || out[i].Err != nil {
			t.Errorf("item %d: %q %v, want %q", i, out[i].State, out[i].Err, want)
		}
	}
}

// TestApplyUpdatesRetriesLostConnection: a results batch whose database
// connection is terminated under it (SQLSTATE 57P01, as each PostgreSQL
// restart does to every open connection) is not refused: ApplyUpdates
// waits the backoff on its clock and writes the batch again on a new
// connection, and the results are recorded once. The termination is
// real (pg_terminate_backend on the backend waiting inside the batch's
// transaction).
func TestApplyUpdatesRetriesLostConnection(t *testing.T) {
	ctx := context.Background()
	sc := newLockScene(t)
	clk := clock.NewFake(time.UnixMilli(1_800_000_000_000))
	svc := &Service{store: sc.s, clk: clk, bus: bus.New(), nodes: noCertificates{}, log: slog.New(slog.DiscardHandler),
		retry: store.DefaultRetry(clk)}
	items := []UpdateItem{sc.updateItem(sc.lo, "succeeded"), sc.updateItem(sc.hi, "succeeded")}
	done := make(chan []UpdateResult, 1)
	go func() { done <- svc.ApplyUpdates(ctx, items) }()
	pid := sc.blockedPID(ctx, t)
	var terminated bool
	if err := sc.db.QueryRowContext(ctx, `SELECT pg_terminate_backend($1, 30000)`, pid).Scan(&terminated); err != nil || !terminated {
		t.Fatalf("terminate the batch's backend: %v %v", terminated, err)
	}
	if err := sc.other.Commit(); err != nil {
		t.Fatal(err)
	}
	// The batch failed once and now waits its backoff on the clock (or,
	// refused at once, already answered).
	bctx, stop := context.WithCancel(ctx)
	defer stop()
	waiting := make(chan error, 1)
	go func() { waiting <- clk.BlockUntil(bctx, 1) }()
	var res []UpdateResult
	select {
	case res = <-done:
		t.Fatalf("batch answered without waiting to retry: %+v", res)
	case err := <-waiting:
		if err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(svc.retry.Backoff)
	res = <-done
	for i, r := range res {
		if r.Err != nil || r.State != "succeeded" {
			t.Fatalf("item %d: %q %v, want succeeded after a retry", i, r.State, r.Err)
		}
	}
	for _, id := range []string{sc.lo, sc.hi} {
		c, ok, err := sc.s.get(ctx, id)
		if err != nil || !ok || c.State != StateSucceeded {
			t.Fatalf("%s: %+v %v %v, want succeeded", id, c, ok, err)
		}
	}
}
