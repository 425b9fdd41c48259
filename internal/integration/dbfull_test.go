package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestDatabaseFullAnswersUnavailable: a control plane whose database is
// full answers each write through the real API with UNAVAILABLE (HTTP
// 503) and the message "the database is full; retry when space returns"
// (store.Full, errs.Unavailable), not INTERNAL_ERROR; reads still answer;
// and once space returns the same process takes writes again (a tenant,
// a command that a real bcd runs), with no restart.
//
// The fault, by dialect: on SQLite a real SQLITE_FULL, from PRAGMA
// max_page_count set on the one writer connection to the database's size
// (the test writes until the first refusal, since a write that fits in
// pages the file already has still succeeds). On PostgreSQL, SQLSTATE
// 53100 (disk_full) raised by a trigger the test puts on the tenants
// table: a tablespace on a tiny tmpfs would need the server on this
// machine and its user to reach the test's folder, which CI's DSN does
// not promise.
func TestDatabaseFullAnswersUnavailable(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		var fill, free func()
		switch db.Dialect {
		case store.SQLite:
			fill = func() {
				var pages int64
				if err := db.DB.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
					t.Fatal(err)
				}
				if _, err := db.ExecContext(ctx, fmt.Sprintf(`PRAGMA max_page_count = %d`, pages)); err != nil {
					t.Fatal(err)
				}
			}
			free = func() {
				if _, err := db.ExecContext(ctx, `PRAGMA max_page_count = 4294967294`); err != nil {
					t.Fatal(err)
				}
			}
		case store.Postgres:
			fill = func() {
				for _, q := range []string{
					`CREATE FUNCTION bc_test_disk_full() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full'; END $$`,
					`CREATE TRIGGER bc_test_disk_full BEFORE INSERT ON tenants FOR EACH ROW EXECUTE FUNCTION bc_test_disk_full()`,
				} {
					if _, err := db.ExecContext(ctx, q); err != nil {
						t.Fatal(err)
					}
				}
			}
			free = func() {
				if _, err := db.ExecContext(ctx, `DROP TRIGGER bc_test_disk_full ON tenants`); err != nil {
					t.Fatal(err)
				}
			}
		}

		fill()
		var refused error
		for i := 0; i < 1000 && refused == nil; i++ {
			_, refused = e.Client.CreateTenant(ctx, "", fmt.Sprintf("fill-%d", i))
		}
		var ae *client.Error
		if !errors.As(refused, &ae) || ae.Code != "UNAVAILABLE" || ae.Status != http.StatusServiceUnavailable || ae.Message != "the database is full; retry when space returns" {
			t.Fatalf("a write to a full database: %v, want UNAVAILABLE (503) \"the database is full; retry when space returns\"", refused)
		}
		if !errors.Is(refused, client.ErrUnavailable) {
			t.Fatalf("%v is not client.ErrUnavailable", refused)
		}
		if _, err := e.Client.Nodes(ctx); err != nil {
			t.Fatalf("a read while the database is full: %v", err)
		}

		free()
		if _, err := e.Client.CreateTenant(ctx, "", "after"); err != nil {
			t.Fatalf("a write once space returned: %v", err)
		}
		c, err := e.Client.CreateCommand(ctx, e.Nodes[0].NodeID(), "diag.run", nil)
		if err != nil {
			t.Fatalf("a command once space returned: %v", err)
		}
		if got := e.WaitCommand(t, c.ID); got.State != "succeeded" {
			t.Fatalf("the command: %s %q, want succeeded", got.State, got.Reason)
		}
	})
}
