package iam_test

import (
	"context"
	"io/fs"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// Migration 0029 makes tenant names unique among live siblings; siblings
// of a database made before it that already share a name keep it on the
// oldest, the others become NAME-ID, and deleted tenants keep theirs.
func TestMigration29RenamesDuplicateSiblings(t *testing.T) {
	storetest.ForEachFreshDialect(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		db, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.MigrateSources(ctx, before(t, 29)); err != nil {
			t.Fatal(err)
		}
		for _, r := range []struct {
			id, parent, name, state string
			at                      int
		}{
			{"tfirst", "root", "acme", "active", 1},
			{"tsecond", "root", "acme", "suspended", 2},
			{"tgone", "root", "acme", "deleted", 0},
			{"tkid", "tfirst", "acme", "active", 3},
		} {
			if _, err := db.ExecContext(ctx, `INSERT INTO tenants (id, parent_id, name, state, created_at) VALUES ($1, $2, $3, $4, $5)`, r.id, r.parent, r.name, r.state, r.at); err != nil {
				t.Fatal(err)
			}
		}
		if err := db.Migrate(ctx); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		want := map[string]string{"tfirst": "acme", "tsecond": "acme-tsecond", "tgone": "acme", "tkid": "acme"}
		for id, name := range want {
			var got string
			if err := db.QueryRowContext(ctx, `SELECT name FROM tenants WHERE id = $1`, id).Scan(&got); err != nil || got != name {
				t.Fatalf("%s: name %q (%v), want %q", id, got, err, name)
			}
		}
		_, err = db.ExecContext(ctx, `INSERT INTO tenants (id, parent_id, name, state, created_at) VALUES ('tthird', 'root', 'acme', 'active', 4)`)
		if !store.IsUniqueViolation(err) {
			t.Fatalf("a third live acme under root: %v, want a unique violation", err)
		}
	})
}

// before returns every module's migrations older than version v.
func before(t *testing.T, v int) []store.Source {
	t.Helper()
	var out []store.Source
	for _, s := range store.Modules() {
		files := fstest.MapFS{}
		err := fs.WalkDir(s.FS, ".", func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".sql") {
				return err
			}
			n, err := strconv.Atoi(strings.SplitN(path, "_", 2)[0])
			if err != nil || n >= v {
				return err
			}
			b, err := fs.ReadFile(s.FS, path)
			files[path] = &fstest.MapFile{Data: b}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, store.Source{Module: s.Module, FS: files})
	}
	return out
}
