package quota

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// TestAdmitHoldsTheTenantLockUntilCommit forces the interleaving the
// per-tenant lock exists for, on PostgreSQL: admission A has counted the
// tenant's rows and not yet inserted its own; admission B starts. B must
// wait for A's transaction before it counts (PostgreSQL's lock table
// shows it blocked by A), then see A's row and be refused. Without the
// lock B counts A's row as absent, admits, and the tenant ends over its
// limit; the test fails on B counting while A holds the lock, with no
// timing involved. Both the counting (Admit) and the tracked
// (AdmitTracked) admissions are checked.
func TestAdmitHoldsTheTenantLockUntilCommit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		admit func(s *Service, ctx context.Context, tx *sql.Tx, count Counter) error
	}{
		{"counted", func(s *Service, ctx context.Context, tx *sql.Tx, count Counter) error {
			return s.Admit(ctx, tx, "t1", Sandboxes, 1, count)
		}},
		{"tracked", func(s *Service, ctx context.Context, tx *sql.Tx, count Counter) error {
			return s.AdmitTracked(ctx, tx, "t1", JoinTokens, 1, 1, count)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := storetest.NewTestPostgres(t)
			ctx := context.Background()
			if _, err := db.ExecContext(ctx, `CREATE TABLE quota_test_rows (tenant_id TEXT NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			s := New(db, clock.NewFake(time.Unix(1_800_000_000, 0)), Limits{Sandboxes: 1, JoinTokens: 1})
			// counted carries each admission's backend id when it has
			// counted; release lets A go on to insert and commit.
			counted := make(chan int, 2)
			release := make(chan struct{})
			released := false
			defer func() { // on a failure, A commits before the schema is dropped
				if !released {
					close(release)
				}
			}()
			admission := func(first bool) <-chan error {
				done := make(chan error, 1)
				go func() {
					done <- db.Tx(ctx, func(tx *sql.Tx) error {
						count := func(ctx context.Context, tx *sql.Tx, _ string) (int64, error) {
							var n int64
							var pid int
							if err := tx.QueryRowContext(ctx, `SELECT COUNT(*), pg_backend_pid() FROM quota_test_rows WHERE tenant_id = 't1'`).Scan(&n, &pid); err != nil {
								return 0, err
							}
							counted <- pid
							if first {
								<-release
							}
							return n, nil
						}
						if err := tc.admit(s, ctx, tx, count); err != nil {
							return err
						}
						_, err := tx.ExecContext(ctx, `INSERT INTO quota_test_rows (tenant_id) VALUES ('t1')`)
						return err
					})
				}()
				return done
			}
			doneA := admission(true)
			pidA := <-counted
			doneB := admission(false)
			storetest.WaitBlockedBy(t, db, pidA, storetest.Finished(counted), "admission B counted while admission A held the tenant's quota lock: the admissions are not serialised")
			close(release)
			released = true
			if err := <-doneA; err != nil {
				t.Fatalf("admission A: %v", err)
			}
			if err := <-doneB; errs.CodeOf(err) != errs.ResourceExhausted {
				t.Fatalf("admission B after A committed: %v, want RESOURCE_EXHAUSTED", err)
			}
			var rows int
			if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM quota_test_rows`).Scan(&rows); err != nil || rows != 1 {
				t.Fatalf("%d rows (%v), want 1: the limit", rows, err)
			}
		})
	}
}
