package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// openPostgresPair opens two handles on one fresh PostgreSQL schema with a
// table t: db, the one under test, and admin, which terminates db's
// backends.
func openPostgresPair(t *testing.T) (db, admin *store.DB) {
	t.Helper()
	ctx := context.Background()
	dsn := storetest.FreshPostgres(t)
	var err error
	if db, err = store.Open(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if admin, err = store.Open(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (id INTEGER PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return db, admin
}

// terminateOwnBackend has admin end, like a database restart does, the
// server process serving tx, and waits until it is gone.
func terminateOwnBackend(ctx context.Context, admin *store.DB, tx *sql.Tx) error {
	var pid int
	if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return err
	}
	var done bool
	if err := admin.QueryRowContext(ctx, `SELECT pg_terminate_backend($1, 30000)`, pid).Scan(&done); err != nil {
		return err
	}
	if !done {
		return errors.New("backend not terminated")
	}
	return nil
}

// TestTxRetryGetsPastTerminatedBackend: a transaction whose server process
// is terminated under it (SQLSTATE 57P01, as in a PostgreSQL restart) is
// run again from the start after the backoff, on a new connection, and
// commits once; when every attempt fails the last error comes back after
// exactly Attempts tries.
func TestTxRetryGetsPastTerminatedBackend(t *testing.T) {
	db, admin := openPostgresPair(t)
	ctx := context.Background()
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	r := store.Retry{Clock: clk, Attempts: 3, Backoff: 50 * time.Millisecond}

	run := func(failUntil int) (int, []error, error) {
		attempts := 0
		var errsSeen []error
		done := make(chan error, 1)
		go func() {
			done <- db.TxRetry(ctx, r, func(tx *sql.Tx) error {
				attempts++
				if attempts <= failUntil {
					if err := terminateOwnBackend(ctx, admin, tx); err != nil {
						return fmt.Errorf("test setup: %w", err)
					}
				}
				_, err := tx.ExecContext(ctx, `INSERT INTO t (id) VALUES (1)`)
				if err != nil {
					errsSeen = append(errsSeen, err)
				}
				return err
			})
		}()
		// Let each wait pass on the fake clock: one after each failure
		// but the last attempt's. Work that ends without waiting (no
		// retry) ends the loop early.
		bctx, stop := context.WithCancel(ctx)
		defer stop()
		wait := r.Backoff
		for range min(failUntil, r.Attempts-1) {
			waiting := make(chan error, 1)
			go func() { waiting <- clk.BlockUntil(bctx, 1) }()
			select {
			case err := <-done:
				return attempts, errsSeen, err
			case err := <-waiting:
				if err != nil {
					t.Fatal(err)
				}
			}
			clk.Advance(wait)
			wait *= 2
		}
		err := <-done
		return attempts, errsSeen, err
	}

	attempts, seen, err := run(1)
	if err != nil || attempts != 2 || len(seen) != 1 || !store.Transient(seen[0]) {
		t.Fatalf("one terminated backend: attempts %d, errors %v, result %v; want 2 attempts, one transient error, success", attempts, seen, err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM t`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows %d %v, want 1", n, err)
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM t`); err != nil {
		t.Fatal(err)
	}
	attempts, seen, err = run(r.Attempts)
	if err == nil || attempts != r.Attempts || len(seen) != r.Attempts || !store.Transient(err) {
		t.Fatalf("every attempt terminated: attempts %d, errors %v, result %v; want %d attempts and the last transient error", attempts, seen, err, r.Attempts)
	}
}

// TestTransientOnRealErrors: the classification on errors the drivers
// really return. A refused connection is transient (the database is
// restarting); a unique violation, on either dialect, and a cancelled
// context are not: trying again would repeat them.
func TestTransientOnRealErrors(t *testing.T) {
	ctx := context.Background()
	_, err := store.Open(ctx, "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=5")
	if err == nil || !store.Transient(err) {
		t.Errorf("refused connection: %v, want transient", err)
	}
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		if _, err := db.ExecContext(ctx, `CREATE TABLE u (id INTEGER PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO u (id) VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		_, err := db.ExecContext(ctx, `INSERT INTO u (id) VALUES (1)`)
		if !store.IsUniqueViolation(err) || store.Transient(err) {
			t.Errorf("unique violation %v: transient %v, want false", err, store.Transient(err))
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err = db.ExecContext(cctx, `INSERT INTO u (id) VALUES (2)`)
		if err == nil || store.Transient(err) {
			t.Errorf("cancelled context %v: transient %v, want false", err, store.Transient(err))
		}
	})
}

// TestTransientOnRealConflicts makes PostgreSQL raise the two conflicts a
// retry gets past, for real, and checks that Transient says so: a
// serialization failure (40001: a repeatable-read transaction updates a
// row another committed after its snapshot) and a deadlock (40P01: two
// transactions lock two rows in opposite order; the second runs the
// detector within 10 ms, the first never does, so the second is the
// victim). The wait is PostgreSQL's lock table, not a sleep.
func TestTransientOnRealConflicts(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewTestPostgres(t)
	if _, err := db.ExecContext(ctx, `CREATE TABLE c (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO c (id, v) VALUES (1, 0), (2, 0)`); err != nil {
		t.Fatal(err)
	}
	begin := func(setup ...string) *sql.Tx {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback() })
		for _, q := range setup {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		return tx
	}

	snap := begin(`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
	var v int
	if err := snap.QueryRowContext(ctx, `SELECT v FROM c WHERE id = 1`).Scan(&v); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE c SET v = v + 1 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	_, err := snap.ExecContext(ctx, `UPDATE c SET v = v + 1 WHERE id = 1`)
	if code := pgCode(err); code != "40001" || !store.Transient(err) {
		t.Errorf("serialization failure %v (SQLSTATE %q): transient %v, want 40001 and true", err, code, store.Transient(err))
	}

	first := begin(`SET LOCAL deadlock_timeout = '1h'`)
	second := begin(`SET LOCAL deadlock_timeout = '10ms'`)
	if _, err := first.ExecContext(ctx, `UPDATE c SET v = v + 1 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := second.ExecContext(ctx, `UPDATE c SET v = v + 1 WHERE id = 2`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := first.ExecContext(ctx, `UPDATE c SET v = v + 1 WHERE id = 2`)
		done <- err
	}()
	storetest.WaitBlockedBy(t, db, storetest.BackendPID(t, second), storetest.Finished(done), "the first transaction locked row 2 while the second held it")
	_, err = second.ExecContext(ctx, `UPDATE c SET v = v + 1 WHERE id = 1`)
	if code := pgCode(err); code != "40P01" || !store.Transient(err) {
		t.Errorf("deadlock %v (SQLSTATE %q): transient %v, want 40P01 and true", err, code, store.Transient(err))
	}
	_ = second.Rollback()
	if err := <-done; err != nil {
		t.Fatalf("the first transaction after the victim rolled back: %v", err)
	}
}

// pgCode is err's PostgreSQL SQLSTATE, or "".
func pgCode(err error) string {
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		return pg.SQLState()
	}
	return ""
}
