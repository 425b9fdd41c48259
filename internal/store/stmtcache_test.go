package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// TestSQLiteStatementCacheKeepsResults: a cached statement answers with
// its new arguments each time, a text run again while a result set of it
// is still open (same connection, in a transaction) gets its own
// statement and both result sets stay correct, a rolled-back write is
// gone, and more distinct texts than the cache holds still run.
func TestSQLiteStatementCacheKeepsResults(t *testing.T) {
	db := storetest.NewTestSQLite(t)
	ctx := context.Background()
	const ins = `INSERT INTO tenants (id, name, state, created_at) VALUES ($1, $2, 'active', $3)`
	for i := 0; i < 5; i++ {
		if _, err := db.ExecContext(ctx, ins, fmt.Sprintf("t%d", i), fmt.Sprintf("n%d", i), i); err != nil {
			t.Fatal(err)
		}
	}
	const byID = `SELECT name FROM tenants WHERE id = $1`
	for i := 4; i >= 0; i-- {
		var name string
		if err := db.QueryRowContext(ctx, byID, fmt.Sprintf("t%d", i)).Scan(&name); err != nil || name != fmt.Sprintf("n%d", i) {
			t.Fatalf("t%d: %q %v", i, name, err)
		}
	}
	err := db.Tx(ctx, func(tx *sql.Tx) error {
		const list = `SELECT id FROM tenants WHERE id LIKE 't%' AND created_at >= $1 ORDER BY id`
		outer, err := tx.QueryContext(ctx, list, 0)
		if err != nil {
			return err
		}
		defer outer.Close()
		var got []string
		for outer.Next() {
			var id string
			if err := outer.Scan(&id); err != nil {
				return err
			}
			// The same text again while the outer rows are open on the
			// same connection: it must get a statement of its own.
			inner, err := tx.QueryContext(ctx, list, 3)
			if err != nil {
				return err
			}
			var n int
			for inner.Next() {
				n++
			}
			inner.Close()
			if n != 2 {
				return fmt.Errorf("inner rows %d, want 2", n)
			}
			got = append(got, id)
		}
		if fmt.Sprint(got) != "[t0 t1 t2 t3 t4]" {
			return fmt.Errorf("outer rows %v", got)
		}
		if _, err := tx.ExecContext(ctx, ins, "t9", "n9", 9); err != nil {
			return err
		}
		return errRollback
	})
	if err != errRollback {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM tenants WHERE id = $1`, "t9").Scan(&n); err != nil || n != 0 {
		t.Fatalf("a rolled-back insert is visible: %d %v", n, err)
	}
	for i := 0; i < 600; i++ {
		var v int
		if err := db.QueryRowContext(ctx, fmt.Sprintf(`SELECT %d + $1`, i), 1).Scan(&v); err != nil || v != i+1 {
			t.Fatalf("distinct text %d: %d %v", i, v, err)
		}
	}
}

var errRollback = fmt.Errorf("rollback")

// BenchmarkSQLiteStatementCache runs one small indexed read and one small
// write, with the statement cache (store.Open) and, as the baseline in
// the same process, on a plain modernc connection to the same file.
func BenchmarkSQLiteStatementCache(b *testing.B) {
	db := storetest.NewTestSQLite(b)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `INSERT INTO tenants (id, name, state, created_at) VALUES ('b1', 'b1', 'active', 0)`); err != nil {
		b.Fatal(err)
	}
	plain, err := sql.Open("sqlite", "file:"+store.PathOf(db)+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	if err != nil {
		b.Fatal(err)
	}
	defer plain.Close()
	plain.SetMaxOpenConns(1)
	for _, c := range []struct {
		name string
		q    interface {
			QueryRowContext(context.Context, string, ...any) *sql.Row
			ExecContext(context.Context, string, ...any) (sql.Result, error)
		}
	}{{"plain", plain}, {"cached", db}} {
		b.Run(c.name+"-read", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				var name string
				if err := c.q.QueryRowContext(ctx, `SELECT name FROM tenants WHERE id = $1 AND state = $2`, "b1", "active").Scan(&name); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"-write", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := c.q.ExecContext(ctx, `UPDATE tenants SET created_at = $1 WHERE id = $2`, i, "b1"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
