package store_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

func TestMigrateIsIdempotentAndPlaceholdersWork(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		if err := db.Migrate(ctx); err != nil {
			t.Fatalf("second migrate: %v", err)
		}
		var name string
		if err := db.QueryRowContext(ctx, `SELECT name FROM tenants WHERE id = $1`, "root").Scan(&name); err != nil {
			t.Fatalf("query: %v", err)
		}
		if name != "root" {
			t.Fatalf("root tenant name = %q", name)
		}
		_, err := db.ExecContext(ctx, `INSERT INTO tenants (id, name, state, created_at) VALUES ($1, $2, $3, $4)`, "root", "x", "active", 1)
		if !store.IsUniqueViolation(err) {
			t.Fatalf("duplicate insert: want unique violation, got %v", err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO worker_keys (id, cert_der, sealed_key, not_after, created_at) VALUES ($1, $2, $3, $4, $5)`, "w", []byte{0, 1, 2}, []byte{3}, 5, 6); err != nil {
			t.Fatalf("blob insert: %v", err)
		}
		var b []byte
		if err := db.QueryRowContext(ctx, `SELECT cert_der FROM worker_keys WHERE id = $1`, "w").Scan(&b); err != nil || len(b) != 3 || b[2] != 2 {
			t.Fatalf("blob read: %v %v", b, err)
		}
	})
}

// On SQLite, reads outside a transaction run on read-only connections
// that see every committed write and refuse to write, while a write
// transaction is open on the writer (so a long write holds no read back).
func TestSQLiteReadersBesideTheWriter(t *testing.T) {
	db := storetest.NewTestSQLite(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `INSERT INTO tenants (id, name, state, created_at) VALUES ('t1', 't1', 'active', 0)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.QueryContext(ctx, `INSERT INTO tenants (id, name, state, created_at) VALUES ('t2', 't2', 'active', 0) RETURNING id`); err == nil {
		t.Fatal("a write ran on a read connection")
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO tenants (id, name, state, created_at) VALUES ('t3', 't3', 'active', 0)`); err != nil {
		t.Fatal(err)
	}
	var n int
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a bound, not a timing: the read must not wait for the writer at all
	defer cancel()
	if err := db.QueryRowContext(rctx, `SELECT COUNT(*) FROM tenants WHERE id IN ('t1', 't3')`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("a read beside an open write transaction: %d %v, want the committed row only", n, err)
	}
}

// TestPostgresPoolKeepsItsConnections: connections that concurrent calls
// opened on PostgreSQL stay in the pool when they come back, instead of
// all but two being closed (each new connection is a newly forked backend
// that prepares every statement again).
func TestPostgresPoolKeepsItsConnections(t *testing.T) {
	db := storetest.NewTestPostgres(t)
	ctx := context.Background()
	var held []*sql.Conn
	for i := 0; i < 8; i++ {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if st := db.Stats(); st.MaxIdleClosed != 0 || st.Idle < 8 {
		t.Fatalf("of 8 connections back in the pool %d were closed, %d kept idle", st.MaxIdleClosed, st.Idle)
	}
}
