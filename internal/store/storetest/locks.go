package storetest

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/store"
)

// BackendPID returns the id of the PostgreSQL backend that serves tx, for
// WaitBlockedBy.
func BackendPID(t testing.TB, tx *sql.Tx) int {
	t.Helper()
	var pid int
	if err := tx.QueryRowContext(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// WaitBlockedBy returns once a backend waits for a lock that backend
// holder holds, as PostgreSQL's own lock table shows (pg_blocking_pids).
// It fails the test with msg if finished reports true first: the other
// side finished without waiting, which it can only do when it takes no
// lock holder holds. Tests of a lock force their interleaving with it:
// hold the lock in a transaction of their own, start the other writer,
// wait here, then end the holder. It polls the lock table, never sleeps,
// bounded by a minute.
func WaitBlockedBy(t testing.TB, db *store.DB, holder int, finished func() bool, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		if finished() {
			t.Fatal(msg)
		}
		var waiting bool
		if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))`, holder).Scan(&waiting); err != nil {
			t.Fatalf("waiting for a backend blocked by %d: %v", holder, err)
		}
		if waiting {
			return
		}
	}
}

// Finished returns a func for WaitBlockedBy that reports whether c has a
// value ready (taking it).
func Finished[T any](c <-chan T) func() bool {
	return func() bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
}
