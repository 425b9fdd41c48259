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
	return migrated(t, FreshSQLite(t))
}

// NewTestPostgres makes a fresh schema on the test PostgreSQL server and
// returns a migrated DB bound to it; the schema is dropped at cleanup.
func NewTestPostgres(t testing.TB) *store.DB {
	t.Helper()
	return migrated(t, FreshPostgres(t))
}

// ForEachFreshDialect runs fn as a subtest once with the DSN of an empty,
// unmigrated SQLite database and once with that of an empty PostgreSQL
// schema (skipped or failed as in ForEachDialect), for tests of migration
// itself. fn opens the DSN as often as it likes.
func ForEachFreshDialect(t *testing.T, fn func(t *testing.T, dsn string)) {
	t.Helper()
	t.Run("sqlite", func(t *testing.T) { fn(t, FreshSQLite(t)) })
	t.Run("postgres", func(t *testing.T) { fn(t, FreshPostgres(t)) })
}

// FreshSQLite returns the DSN of a new, empty SQLite database in
// t.TempDir().
func FreshSQLite(t testing.TB) string {
	t.Helper()
	return "sqlite:" + filepath.Join(t.TempDir(), "control.db")
}

// FreshPostgres makes a fresh, empty schema on the test PostgreSQL server
// and returns a DSN bound to it; the schema is dropped at cleanup.
func FreshPostgres(t testing.TB) string {
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
	return fmt.Sprintf("%s%ssearch_path=%s", dsn, sep, schema)
}

// migrated opens dsn, migrates it and closes it at cleanup.
func migrated(t testing.TB, dsn string) *store.DB {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatalf("open test database: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Migrate(ctx); err != nil {
		t.Fatalf("migrate %s: %v", db.Dialect, err)
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
