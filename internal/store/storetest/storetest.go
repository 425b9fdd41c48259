// Package storetest gives tests a fresh, migrated database of each dialect.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store"
)

// DefaultTestPostgresDSN is used when BC_TEST_POSTGRES_DSN is unset.
const DefaultTestPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// ForEachDialect runs fn as a subtest once on a fresh SQLite database and once
// on a fresh PostgreSQL schema. PostgreSQL is used when it answers at
// BC_TEST_POSTGRES_DSN (default DefaultTestPostgresDSN); when it does not,
// the subtest is skipped, or fails when BC_REQUIRE_POSTGRES=1 (CI sets it).
// Subtests are named "sqlite" and "postgres".
func ForEachDialect(t *testing.T, fn func(t *testing.T, db *store.DB)) {
	t.Helper()
	t.Run("sqlite", func(t *testing.T) { fn(t, NewTestSQLite(t)) })
	t.Run("postgres", func(t *testing.T) { fn(t, NewTestPostgres(t)) })
}

// NewTestSQLite opens a migrated SQLite database in t.TempDir().
func NewTestSQLite(t testing.TB) *store.DB {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Migrate(ctx); err != nil {
		t.Fatalf("migrate sqlite: %v", err)
	}
	return db
}

// NewTestPostgres makes a fresh schema on the test PostgreSQL server and
// returns a migrated DB bound to it; the schema is dropped at cleanup.
func NewTestPostgres(t testing.TB) *store.DB {
	t.Helper()
	ctx := context.Background()
	dsn := os.Getenv("BC_TEST_POSTGRES_DSN")
	if dsn == "" {
		dsn = DefaultTestPostgresDSN
	}
	admin, err := store.Open(ctx, dsn)
	if err != nil {
		if os.Getenv("BC_REQUIRE_POSTGRES") == "1" {
			t.Fatalf("PostgreSQL required (BC_REQUIRE_POSTGRES=1) but not reachable: %v", err)
		}
		t.Skipf("PostgreSQL not reachable, skipping: %v", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "bc_test_" + hex.EncodeToString(b[:])
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close()
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		_, _ = admin.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		admin.Close()
	})
	sep := "?"
	if containsByte(dsn, '?') {
		sep = "&"
	}
	db, err := store.Open(ctx, fmt.Sprintf("%s%ssearch_path=%s", dsn, sep, schema))
	if err != nil {
		t.Fatalf("open schema: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Migrate(ctx); err != nil {
		t.Fatalf("migrate postgres: %v", err)
	}
	return db
}

func containsByte(s string, c byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return true
		}
	}
	return false
}
