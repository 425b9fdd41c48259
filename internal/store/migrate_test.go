package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

func TestPlanJoinsModulePartsByVersion(t *testing.T) {
	plan, err := store.Plan([]store.Source{
		{Module: "a", FS: fstest.MapFS{"0001_init.sql": {Data: []byte("A1;")}, "0003_more.sql": {Data: []byte("A3;")}}},
		{Module: "b", FS: fstest.MapFS{"0001_init.sql": {Data: []byte("B1;")}, "0002_b.sql": {Data: []byte("B2;")}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range plan {
		for _, p := range v.Parts {
			got = append(got, p.SQL)
		}
		got = append(got, "|")
	}
	if want := "A1; B1; | B2; | A3; |"; strings.Join(got, " ") != want {
		t.Fatalf("plan = %q, want %q", strings.Join(got, " "), want)
	}
}

func TestPlanRefusesAmbiguousFiles(t *testing.T) {
	for name, fsys := range map[string]fstest.MapFS{
		"two files, one version": {"0001_a.sql": {Data: []byte(";")}, "0001_b.sql": {Data: []byte(";")}},
		"no version":             {"init.sql": {Data: []byte(";")}},
		"version zero":           {"0000_init.sql": {Data: []byte(";")}},
	} {
		if _, err := store.Plan([]store.Source{{Module: "m", FS: fsys}}); err == nil {
			t.Errorf("%s: Plan accepted it", name)
		}
	}
}

// TestMigrateUpgradesSchema25Dump loads a database dumped at schema version
// 25 with rows in it (made by `better-compute dev` before the migrations
// moved into their modules), migrates it, and checks that nothing was
// re-applied or lost and that its schema is exactly the schema a fresh
// database gets.
func TestMigrateUpgradesSchema25Dump(t *testing.T) {
	storetest.ForEachFreshDialect(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		db, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		dump, err := os.ReadFile("testdata/upgrade_v25." + string(db.Dialect) + ".sql")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, string(dump)); err != nil {
			t.Fatalf("load dump: %v", err)
		}
		before := counts(t, db)
		if err := db.Migrate(ctx); err != nil {
			t.Fatalf("migrate the dump: %v", err)
		}
		// Versions after 25 are applied to the dump; nothing else changes.
		after := counts(t, db)
		var added int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version > 25`).Scan(&added); err != nil {
			t.Fatal(err)
		}
		if after.versions -= added; after != before {
			t.Fatalf("rows after migrating = %v (less %d versions after 25), before = %v", after, added, before)
		}
		if before.versions != 12 || before.audit != 10 || before.nodes != 2 || before.commands != 1 || before.secrets != 1 || before.batches != 1 {
			t.Fatalf("dump rows = %+v, not the dump's", before)
		}
		fresh := storetest.NewTestSQLite(t)
		if db.Dialect == store.Postgres {
			fresh = storetest.NewTestPostgres(t)
		}
		if got, want := schemaOf(t, db), schemaOf(t, fresh); got != want {
			t.Fatalf("schema of the upgraded dump differs from a fresh one:\n--- dump\n%s\n--- fresh\n%s", got, want)
		}
	})
}

type rowCounts struct{ versions, audit, nodes, commands, secrets, batches int }

func counts(t *testing.T, db *store.DB) rowCounts {
	t.Helper()
	var c rowCounts
	for q, dst := range map[string]*int{
		`SELECT COUNT(*) FROM schema_migrations`: &c.versions,
		`SELECT COUNT(*) FROM audit_events`:      &c.audit,
		`SELECT COUNT(*) FROM nodes`:             &c.nodes,
		`SELECT COUNT(*) FROM commands`:          &c.commands,
		`SELECT COUNT(*) FROM secrets`:           &c.secrets,
		`SELECT COUNT(*) FROM batches`:           &c.batches,
	} {
		if err := db.DB.QueryRowContext(context.Background(), q).Scan(dst); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return c
}

// schemaOf lists every table's columns with their types, and every index.
func schemaOf(t *testing.T, db *store.DB) string {
	t.Helper()
	cols := `SELECT m.name, p.name, p.type FROM sqlite_master m, pragma_table_info(m.name) p WHERE m.type = 'table' ORDER BY 1, 2`
	idx := `SELECT name, tbl_name, '' FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_autoindex%' ORDER BY 1`
	if db.Dialect == store.Postgres {
		cols = `SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = current_schema() ORDER BY 1, 2`
		idx = `SELECT indexname, tablename, indexdef FROM pg_indexes WHERE schemaname = current_schema() ORDER BY 1`
	}
	var b strings.Builder
	for _, q := range []string{cols, idx} {
		rows, err := db.DB.QueryContext(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var x, y, z string
			if err := rows.Scan(&x, &y, &z); err != nil {
				t.Fatal(err)
			}
			// A PostgreSQL index definition names its schema, which
			// differs between two test schemas.
			z = strings.ReplaceAll(z, currentSchema(t, db)+".", "")
			b.WriteString(x + " " + y + " " + z + "\n")
		}
		rows.Close()
	}
	return b.String()
}

func currentSchema(t *testing.T, db *store.DB) string {
	if db.Dialect != store.Postgres {
		return "\x00"
	}
	var s string
	if err := db.DB.QueryRowContext(context.Background(), `SELECT current_schema()`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestMigrateFromManyProcessesAtOnce starts several migrations of one empty
// database together, each on its own handle (its own connections, as
// separate `serve` processes would have): the migration lock must let one
// apply each version and the others find it applied. Without the lock it
// fails on PostgreSQL every time and on SQLite now and then (SQLite's own
// write lock serialises most of it); TestMigrateWaitsForTheLock is the
// exact test of the lock.
func TestMigrateFromManyProcessesAtOnce(t *testing.T) {
	storetest.ForEachFreshDialect(t, func(t *testing.T, dsn string) {
		migrateTogether(t, dsn, store.Modules())
	})
}

func migrateTogether(t *testing.T, dsn string, sources []store.Source) {
	t.Helper()
	ctx := context.Background()
	const n = 6
	dbs := make([]*store.DB, n)
	for i := range dbs {
		db, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		dbs[i] = db
	}
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, db := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = db.MigrateSources(ctx, sources)
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migration %d: %v", i, err)
		}
	}
	plan, err := store.Plan(sources)
	if err != nil {
		t.Fatal(err)
	}
	var recorded int
	if err := dbs[0].DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations`).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if recorded != len(plan) {
		t.Fatalf("recorded %d versions, want %d", recorded, len(plan))
	}
}

func TestMigrateRefusesANewerSchema(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		if _, err := db.ExecContext(ctx, `INSERT INTO schema_migrations (version) VALUES (9999)`); err != nil {
			t.Fatal(err)
		}
		err := db.Migrate(ctx)
		if err == nil || !strings.Contains(err.Error(), "database schema version 9999 is newer than this binary's") {
			t.Fatalf("Migrate = %v, want a refusal of the newer schema", err)
		}
	})
}

// TestMigrateWaitsForTheLock holds the migration lock on one handle and
// migrates on another: the second must wait (here until its context ends,
// having changed nothing), then migrate once the lock is released.
func TestMigrateWaitsForTheLock(t *testing.T) {
	storetest.ForEachFreshDialect(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		holder, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		other, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		unlock, err := holder.LockMigrations(ctx)
		if err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if err := other.Migrate(short); !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(fmt.Sprint(err), "canceling statement") {
			t.Fatalf("Migrate while another holds the lock = %v, want it to wait until its context ends", err)
		}
		var tables int
		q := `SELECT COUNT(*) FROM sqlite_master WHERE name = 'schema_migrations'`
		if holder.Dialect == store.Postgres {
			q = `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'schema_migrations'`
		}
		if err := holder.DB.QueryRowContext(ctx, q).Scan(&tables); err != nil || tables != 0 {
			t.Fatalf("schema_migrations tables = %d (%v): the waiting migration wrote", tables, err)
		}
		unlock()
		if err := other.Migrate(ctx); err != nil {
			t.Fatalf("Migrate after the lock was released: %v", err)
		}
	})
}
