package quota

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// The tracked usage admits without counting, refuses only on an exact
// recount (rows freed without a decrement leave it high, never low), does
// that recount at most once per RecountRefusedEvery, and recounts a usage
// older than RecountEvery.
func TestAdmitTrackedRecounts(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		if _, err := db.ExecContext(ctx, `CREATE TABLE quota_test_rows (tenant_id TEXT NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		clk := clock.NewFake(time.Unix(1_800_000_000, 0))
		s := New(db, clk, Limits{JoinTokens: 3})
		counts := 0
		count := func(ctx context.Context, tx *sql.Tx, _ string) (int64, error) {
			counts++
			var n int64
			err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM quota_test_rows WHERE tenant_id = 't1'`).Scan(&n)
			return n, err
		}
		admit := func() error {
			return db.Tx(ctx, func(tx *sql.Tx) error {
				if err := s.AdmitTracked(ctx, tx, "t1", JoinTokens, 1, 1, count); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx, `INSERT INTO quota_test_rows (tenant_id) VALUES ('t1')`)
				return err
			})
		}
		for i := range 3 {
			if err := admit(); err != nil {
				t.Fatalf("admit %d: %v", i, err)
			}
		}
		if counts != 1 {
			t.Fatalf("%d counts for three admissions, want 1 (the first)", counts)
		}
		var e *errs.Error
		if err := admit(); !errors.As(err, &e) || e.Code != errs.ResourceExhausted || e.Message != Message(JoinTokens, 3, 3, 1) || counts != 2 {
			t.Fatalf("at the limit: %v after %d counts", err, counts)
		}
		if _, err := db.ExecContext(ctx, `DELETE FROM quota_test_rows WHERE tenant_id = 't1'`); err != nil {
			t.Fatal(err)
		}
		// Freed rows: the usage is still 3, and a recount was made less
		// than RecountRefusedEvery ago, so this one is refused uncounted.
		if err := admit(); errs.CodeOf(err) != errs.ResourceExhausted || counts != 2 {
			t.Fatalf("within the recount bound: %v after %d counts", err, counts)
		}
		clk.Advance(RecountRefusedEvery)
		if err := admit(); err != nil || counts != 3 {
			t.Fatalf("after the bound the recount admits: %v after %d counts", err, counts)
		}
		clk.Advance(RecountEvery)
		if err := admit(); err != nil || counts != 4 {
			t.Fatalf("a stale usage is recounted first: %v after %d counts", err, counts)
		}
		var used int64
		if err := db.QueryRow(`SELECT used FROM quota_usage WHERE tenant_id = 't1' AND kind = 'join_tokens'`).Scan(&used); err != nil || used != 2 {
			t.Fatalf("tracked usage %d (%v), want 2", used, err)
		}
		// Another tenant and the root tenant are apart.
		if err := db.Tx(ctx, func(tx *sql.Tx) error {
			return s.AdmitTracked(ctx, tx, iam.RootTenant, JoinTokens, 1<<40, 1<<40, count)
		}); err != nil {
			t.Fatalf("root: %v", err)
		}
	})
}

// TestTopLevelKeptPerTenant: a tenant's top-level tenant is read from the
// tenant tree once and then kept (a tenant is never moved), for nested
// and top-level tenants alike; a tenant not in the table is its own and
// is read again next time.
func TestTopLevelKeptPerTenant(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		for _, r := range [][2]string{{"top", iam.RootTenant}, {"mid", "top"}, {"leaf", "mid"}} {
			if _, err := db.ExecContext(ctx, `INSERT INTO tenants (id, parent_id, name, state, created_at) VALUES ($1, $2, $3, 'active', 0)`, r[0], r[1], r[0]); err != nil {
				t.Fatal(err)
			}
		}
		s := New(db, nil, Limits{})
		read := func(tenant string) (string, error) {
			var top string
			err := db.Tx(ctx, func(tx *sql.Tx) error {
				var err error
				top, err = s.TopLevel(ctx, tx, tenant)
				return err
			})
			return top, err
		}
		for _, tn := range []string{"leaf", "mid", "top"} {
			if got, err := read(tn); err != nil || got != "top" {
				t.Fatalf("TopLevel(%s) = %q, %v; want top", tn, got, err)
			}
		}
		// Kept: answered with the tenant tree gone.
		if _, err := db.ExecContext(ctx, `UPDATE tenants SET parent_id = 'elsewhere' WHERE id = 'mid'`); err != nil {
			t.Fatal(err)
		}
		if got, err := read("leaf"); err != nil || got != "top" {
			t.Fatalf("TopLevel(leaf) again = %q, %v; want the kept top", got, err)
		}
		if got, err := read("unknown"); err != nil || got != "unknown" {
			t.Fatalf("TopLevel(unknown) = %q, %v; want itself", got, err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO tenants (id, parent_id, name, state, created_at) VALUES ('unknown', 'top', 'u', 'active', 0)`); err != nil {
			t.Fatal(err)
		}
		if got, err := read("unknown"); err != nil || got != "top" {
			t.Fatalf("TopLevel(unknown) once created = %q, %v; want top (not kept while unknown)", got, err)
		}
	})
}
