package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Why not goose or golang-migrate: both want one file per version with one
// version table of their own shape. Here a version is split across the
// modules that own the tables it touches (each module keeps its part in its
// own migrations package), and databases made before the split record
// versions 1 to 25 in schema_migrations(version): applying a version as the
// union of its modules' parts keeps every existing database's record valid
// with no translation step. The runner is the three things below: read the
// parts, hold a lock across processes, apply each missing version in one
// transaction.

// Source is one module's migrations: files named NNNN_description.sql in FS,
// where NNNN is the global schema version the file is that module's part of.
type Source struct {
	Module string
	FS     fs.FS
}

// Part is one module's part of a schema version.
type Part struct {
	Module string
	Name   string
	SQL    string
}

// Version is one schema version: every module's part of it, in module order.
type Version struct {
	N     int
	Parts []Part
}

// Plan reads sources into versions in ascending order. A file name without
// a version number, or two files of one module for one version, is an
// error: a version's parts must be unambiguous.
func Plan(sources []Source) ([]Version, error) {
	byN := map[int]*Version{}
	for _, src := range sources {
		names, err := fs.Glob(src.FS, "*.sql")
		if err != nil {
			return nil, fmt.Errorf("store: list %s migrations: %w", src.Module, err)
		}
		sort.Strings(names)
		seen := map[int]string{}
		for _, name := range names {
			n, err := strconv.Atoi(strings.SplitN(name, "_", 2)[0])
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("store: %s migration %s: name must start with a positive version number", src.Module, name)
			}
			if prev, dup := seen[n]; dup {
				return nil, fmt.Errorf("store: %s migrations %s and %s share version %d", src.Module, prev, name, n)
			}
			seen[n] = name
			raw, err := fs.ReadFile(src.FS, name)
			if err != nil {
				return nil, fmt.Errorf("store: read %s migration %s: %w", src.Module, name, err)
			}
			v := byN[n]
			if v == nil {
				v = &Version{N: n}
				byN[n] = v
			}
			v.Parts = append(v.Parts, Part{Module: src.Module, Name: name, SQL: string(raw)})
		}
	}
	out := make([]Version, 0, len(byN))
	for _, v := range byN {
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].N < out[j].N })
	return out, nil
}

// Migrate applies every module's migrations (Modules) not yet applied.
func (db *DB) Migrate(ctx context.Context) error { return db.MigrateSources(ctx, Modules()) }

// MigrateSources applies the versions of sources not yet recorded in
// schema_migrations, each in its own transaction, while holding a lock that
// every process migrating the same database takes: several `serve`
// processes may start together, and each must find the schema either
// untouched or complete. It refuses a database whose schema is newer than
// sources, which an older binary must not write to.
func (db *DB) MigrateSources(ctx context.Context, sources []Source) error {
	plan, err := Plan(sources)
	if err != nil {
		return err
	}
	unlock, err := db.lockMigrations(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)`); err != nil {
		return fmt.Errorf("store: migrations table: %w", err)
	}
	applied, err := db.appliedVersions(ctx)
	if err != nil {
		return err
	}
	if newest, known := maxKey(applied), lastVersion(plan); newest > known {
		return fmt.Errorf("store: database schema version %d is newer than this binary's %d: upgrade the binary", newest, known)
	}
	for _, v := range plan {
		if applied[v.N] {
			continue
		}
		if err := db.apply(ctx, v); err != nil {
			return err
		}
	}
	return nil
}

func (db *DB) appliedVersions(ctx context.Context) (map[int]bool, error) {
	// The writer connection, not a reader: on SQLite the readers may not
	// see a table made a moment ago by another process's transaction
	// until their next read snapshot, and this read decides what to apply.
	rows, err := db.DB.QueryContext(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("store: read schema versions: %w", err)
	}
	defer rows.Close()
	applied := map[int]bool{}
	for rows.Next() {
		var n int
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("store: read schema versions: %w", err)
		}
		applied[n] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: read schema versions: %w", err)
	}
	return applied, nil
}

// apply runs every part of v and records it, in one transaction.
func (db *DB) apply(ctx context.Context, v Version) error {
	return db.Tx(ctx, func(tx *sql.Tx) error {
		for _, p := range v.Parts {
			text := p.SQL
			if db.Dialect == Postgres {
				text = strings.ReplaceAll(text, "BLOB", "BYTEA")
			}
			for _, stmt := range splitStatements(text) {
				if _, err := tx.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("store: migration %d (%s/%s): exec %q: %w", v.N, p.Module, p.Name, firstLine(stmt), err)
				}
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, v.N); err != nil {
			return fmt.Errorf("store: record migration %d: %w", v.N, err)
		}
		return nil
	})
}

// lockMigrations takes the migration lock and returns its release: on
// PostgreSQL a session advisory lock keyed by the current schema, held on
// one connection; on SQLite an exclusive flock on a file beside the
// database (not the database file itself: closing any descriptor of that
// file would drop SQLite's own POSIX locks).
func (db *DB) lockMigrations(ctx context.Context) (func(), error) {
	if db.Dialect == Postgres {
		conn, err := db.DB.Conn(ctx)
		if err != nil {
			return nil, fmt.Errorf("store: migration lock: %w", err)
		}
		const key = `hashtext('bettercompute.migrate:' || current_schema())`
		if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock(`+key+`)`); err != nil {
			conn.Close()
			return nil, fmt.Errorf("store: migration lock: %w", err)
		}
		return func() {
			_, _ = conn.ExecContext(context.Background(), `SELECT pg_advisory_unlock(`+key+`)`)
			conn.Close()
		}, nil
	}
	if db.path == "" {
		return nil, errors.New("store: migration lock: SQLite database has no file path")
	}
	f, err := os.OpenFile(db.path+".migrate-lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: migration lock: %w", err)
	}
	// flock cannot be interrupted by a context, so try without blocking
	// and retry until ctx ends.
	retry := time.NewTicker(20 * time.Millisecond)
	defer retry.Stop()
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("store: migration lock: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("store: migration lock: %w", ctx.Err())
		case <-retry.C:
		}
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

func maxKey(m map[int]bool) int {
	n := 0
	for k := range m {
		n = max(n, k)
	}
	return n
}

func lastVersion(plan []Version) int {
	if len(plan) == 0 {
		return 0
	}
	return plan[len(plan)-1].N
}

// splitStatements splits a migration on semicolons at line ends, dropping
// comment-only lines. Migrations hold no semicolons inside literals.
func splitStatements(text string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(text, "\n") {
		trim := strings.TrimSpace(line)
		if trim == "" || strings.HasPrefix(trim, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		if strings.HasSuffix(trim, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
