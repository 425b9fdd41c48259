// Package store opens the control plane's database and keeps its schema.
//
// SQLite (pure Go, modernc.org/sqlite) is the embedded default; PostgreSQL
// (pgx) is the production store. Queries are written once with $N
// placeholders, which both dialects accept; the few places where the
// dialects differ go through Dialect. Each module owns its tables and keeps
// its schema changes in its own migrations package; Migrate applies them
// (migrate.go).
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	"modernc.org/sqlite"               // registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"
)

// Dialect names the database engine behind a DB.
type Dialect string

// The supported dialects.
const (
	SQLite   Dialect = "sqlite"
	Postgres Dialect = "postgres"
)

// DB is a database handle that knows its dialect.
type DB struct {
	*sql.DB
	Dialect Dialect

	// reader, on SQLite, is a pool of read-only connections that
	// QueryContext, QueryRowContext and Stmt use outside transactions: in
	// WAL mode readers never wait for the one writer, so a long or busy
	// write (one tenant's bulk call) does not hold every other call's
	// reads behind it. Writes and transactions use the one writer
	// connection. nil on PostgreSQL, whose pool serves both.
	reader *sql.DB

	stmts sync.Map // query text -> *sql.Stmt, for hot paths

	// path is the SQLite database file ("" on PostgreSQL); Migrate locks
	// path+".migrate-lock" so that processes starting together migrate
	// one at a time.
	path string
}

// QueryContext runs a read outside any transaction (on SQLite, on a
// read-only connection: never a statement that writes).
func (db *DB) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if db.reader != nil {
		return db.reader.QueryContext(ctx, query, args...)
	}
	return db.DB.QueryContext(ctx, query, args...)
}

// QueryRowContext is QueryContext for one row.
func (db *DB) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if db.reader != nil {
		return db.reader.QueryRowContext(ctx, query, args...)
	}
	return db.DB.QueryRowContext(ctx, query, args...)
}

// QueryRow is QueryRowContext without a context.
func (db *DB) QueryRow(query string, args ...any) *sql.Row {
	return db.QueryRowContext(context.Background(), query, args...)
}

// Query is QueryContext without a context.
func (db *DB) Query(query string, args ...any) (*sql.Rows, error) {
	return db.QueryContext(context.Background(), query, args...)
}

// Stmt returns a prepared read statement for query (on SQLite, on the
// read-only connections), prepared once per DB and reused (database/sql re-prepares it on other connections as needed).
// Hot read paths use it: preparing is most of a small query's cost on
// SQLite.
func (db *DB) Stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if st, ok := db.stmts.Load(query); ok {
		return st.(*sql.Stmt), nil
	}
	prep := db.DB.PrepareContext
	if db.reader != nil {
		prep = db.reader.PrepareContext
	}
	st, err := prep(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("store: prepare: %w", err)
	}
	if prev, loaded := db.stmts.LoadOrStore(query, st); loaded {
		st.Close()
		return prev.(*sql.Stmt), nil
	}
	return st, nil
}

// Close closes the prepared statements and the database.
func (db *DB) Close() error {
	db.stmts.Range(func(_, v any) bool {
		v.(*sql.Stmt).Close()
		return true
	})
	if db.reader != nil {
		db.reader.Close()
	}
	return db.DB.Close()
}

// Open opens a database by DSN: "sqlite:PATH" (or a path ending in .db) for
// SQLite, "postgres://…" for PostgreSQL. It does not migrate.
func Open(ctx context.Context, dsn string) (*DB, error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		sqldb, err := sql.Open("pgx", dsn)
		if err != nil {
			return nil, fmt.Errorf("store: open postgres: %w", err)
		}
		sqldb.SetMaxOpenConns(16)
		// Keep them all: database/sql keeps two idle by default and closes
		// the others as they come back, so under more than two concurrent
		// statements every call opened a new connection, which PostgreSQL
		// serves with a newly forked backend whose caches start cold and
		// which prepares every statement again (joins ran at under a third
		// of their rate, the machine busy forking). An idle connection is
		// closed after a few minutes.
		sqldb.SetMaxIdleConns(16)
		sqldb.SetConnMaxIdleTime(5 * time.Minute)
		if err := sqldb.PingContext(ctx); err != nil {
			sqldb.Close()
			return nil, fmt.Errorf("store: ping postgres: %w", err)
		}
		return &DB{DB: sqldb, Dialect: Postgres}, nil
	case strings.HasPrefix(dsn, "sqlite:"), strings.HasSuffix(dsn, ".db"):
		path := strings.TrimPrefix(dsn, "sqlite:")
		// The database holds hashes, sealed keys and audit rows: 0600. SQLite
		// gives its -wal and -shm files the database file's mode.
		if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err == nil {
			f.Close()
		}
		q := "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_txlock=immediate"
		sqldb := sql.OpenDB(cachingConnector{dsn: "file:" + path + q, drv: &sqlite.Driver{}})
		// One connection: SQLite has one writer anyway, and a single
		// connection makes every transaction strictly serial.
		sqldb.SetMaxOpenConns(1)
		if err := sqldb.PingContext(ctx); err != nil {
			sqldb.Close()
			return nil, fmt.Errorf("store: ping sqlite: %w", err)
		}
		// Readers: WAL lets them read the last committed state while the
		// writer writes. query_only refuses a write on them.
		reader := sql.OpenDB(cachingConnector{dsn: "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)&_pragma=query_only(1)", drv: &sqlite.Driver{}})
		reader.SetMaxOpenConns(4)
		// Keep all four open: database/sql keeps two idle by default and
		// closes the others as they come back, and a connection closed
		// loses its prepared statements (statement parsing was a third of
		// a warm claim's authorization when readers came and went).
		reader.SetMaxIdleConns(4)
		if err := reader.PingContext(ctx); err != nil {
			reader.Close()
			sqldb.Close()
			return nil, fmt.Errorf("store: ping sqlite readers: %w", err)
		}
		return &DB{DB: sqldb, Dialect: SQLite, reader: reader, path: path}, nil
	default:
		return nil, errors.New("store: DSN must start with sqlite: or postgres://")
	}
}

// Tx runs fn in a transaction, committing when it returns nil.
func (db *DB) Tx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	return nil
}

// ReadTx runs fn in a read-only transaction that sees one snapshot of the
// database from its first read to its end, whatever commits meanwhile:
// on SQLite a deferred transaction on a read-only connection (WAL keeps
// its snapshot and never blocks the writer), on PostgreSQL REPEATABLE
// READ, READ ONLY. It is always rolled back. For a long check that must
// not mistake a write committed while it reads for tampering (audit
// verify).
func (db *DB) ReadTx(ctx context.Context, fn func(*sql.Tx) error) error {
	var tx *sql.Tx
	var err error
	if db.reader != nil {
		tx, err = db.reader.BeginTx(ctx, nil)
	} else {
		tx, err = db.DB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	}
	if err != nil {
		return fmt.Errorf("store: begin read: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	return fn(tx)
}

// IsUniqueViolation reports whether err is a unique-constraint or
// primary-key violation in either dialect, by the driver's error code
// (PostgreSQL SQLSTATE 23505; SQLite's extended codes, which modernc
// turns on), never by its text.
func IsUniqueViolation(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "23505"
	}
	var lite *sqlite.Error
	if errors.As(err, &lite) {
		return lite.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || lite.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
	}
	return false
}

// Args builds a statement's placeholders and its arguments together, for
// statements whose length is known only at run time (IN lists, multi-row
// inserts). Append placeholders in the order they appear in the text.
// PostgreSQL gets $1, $2, …; SQLite gets anonymous ?s, because SQLite
// resolves every named or numbered parameter ($N, ?N) with a linear search
// at parse time, which made a 5,000-value statement take seconds.
type Args struct {
	dialect Dialect
	vals    []any
}

// NewArgs returns an empty argument list for db's dialect.
func (db *DB) NewArgs() *Args { return &Args{dialect: db.Dialect} }

// NewArgsFor returns an empty argument list for dialect d (for code that
// holds a transaction rather than the DB).
func NewArgsFor(d Dialect) *Args { return &Args{dialect: d} }

// Add appends v and returns its placeholder.
func (a *Args) Add(v any) string {
	a.vals = append(a.vals, v)
	if a.dialect == SQLite {
		return "?"
	}
	return "$" + strconv.Itoa(len(a.vals))
}

// Typed appends v and returns its placeholder cast to pgType on
// PostgreSQL (where a VALUES list would otherwise type it text); SQLite
// needs no cast.
func (a *Args) Typed(v any, pgType string) string {
	p := a.Add(v)
	if a.dialect == SQLite {
		return p
	}
	return p + "::" + pgType
}

// List appends vs and returns their placeholders, comma separated.
func (a *Args) List(vs ...any) string {
	var b strings.Builder
	for i, v := range vs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(a.Add(v))
	}
	return b.String()
}

// Strings appends vs and returns their placeholders, comma separated.
func (a *Args) Strings(vs []string) string {
	anys := make([]any, len(vs))
	for i, v := range vs {
		anys[i] = v
	}
	return a.List(anys...)
}

// Values returns the arguments in placeholder order.
func (a *Args) Values() []any { return a.vals }

// InChunk bounds how many values one IN list carries, well under SQLite's
// limit of bound parameters per statement.
const InChunk = 500
