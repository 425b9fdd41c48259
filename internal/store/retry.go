package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// Transient reports whether err is a failure that the same work, tried
// again in a new transaction on a new connection, can get past:
// PostgreSQL's serialization failure (SQLSTATE 40001) and deadlock
// (40P01), the server shutting down, crashing or not yet accepting
// (57P01, 57P02, 57P03), a connection exception (class 08), a connection
// the driver found refused, reset or closed, and SQLite's busy or locked
// database. A constraint violation, a syntax error or a cancelled context
// is not: trying again would only repeat it (or outlive its caller). It
// reads the driver's codes and error types, never an error's text.
func Transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch pg.Code {
		case "40001", "40P01", "57P01", "57P02", "57P03":
			return true
		}
		return strings.HasPrefix(pg.Code, "08")
	}
	var lite *sqlite.Error
	if errors.As(err, &lite) {
		primary := lite.Code() & 0xff
		return primary == sqlite3.SQLITE_BUSY || primary == sqlite3.SQLITE_LOCKED
	}
	var connect *pgconn.ConnectError
	if errors.As(err, &connect) {
		return true
	}
	for _, e := range []error{driver.ErrBadConn, syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE, io.EOF, io.ErrUnexpectedEOF, net.ErrClosed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return pgconn.SafeToRetry(err)
}

// Full reports whether err is the database refusing a write for want of
// space: SQLite's SQLITE_FULL (the disk, or max_page_count) or
// PostgreSQL's disk_full (SQLSTATE 53100), classified by driver code,
// never text. It is not Transient: retrying at once does not help, but
// the same call succeeds once space returns, with no restart (the api
// answers UNAVAILABLE, errs.Unavailable, and DatabaseFullMessage).
func Full(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "53100"
	}
	var lite *sqlite.Error
	if errors.As(err, &lite) {
		return lite.Code()&0xff == sqlite3.SQLITE_FULL
	}
	return false
}

// DatabaseFullMessage is the safe message of an answer refused because
// the database is full (Full).
const DatabaseFullMessage = "the database is full; retry when space returns"

// Retry tries work again after a Transient failure, a bounded number of
// times with a doubling wait, so that a deadlock, a serialization failure
// or a database restart of a fraction of a second costs a short delay
// instead of a refusal. The work must be safe to run again: a transaction
// that rolled back, or whose commit is unknown but re-applies to the same
// end.
type Retry struct {
	// Clock times the waits between attempts (clock.Real in production,
	// a clock.Fake in tests).
	Clock clock.Clock
	// Attempts is how many times the work runs at most (at least once).
	Attempts int
	// Backoff is the wait after the first failure; each later wait is
	// twice the one before.
	Backoff time.Duration
}

// DefaultRetry is the bound the modules' writes use: 6 attempts over
// about 1.5 s of waits (50 ms doubling), which outlasts a PostgreSQL
// restart of a few tenths of a second and a deadlock's victim retrying
// once the winner committed.
func DefaultRetry(clk clock.Clock) Retry {
	return Retry{Clock: clk, Attempts: 6, Backoff: 50 * time.Millisecond}
}

// Do runs fn until it returns nil, an error that is not Transient, or the
// attempts are spent, waiting between attempts; it returns fn's last
// error (or ctx's, when ctx ends during a wait).
func (r Retry) Do(ctx context.Context, fn func() error) error {
	wait := r.Backoff
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || attempt >= r.Attempts || !Transient(err) {
			return err
		}
		t := r.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C():
		}
		wait *= 2
	}
}

// TxRetry runs fn in a transaction (Tx) under r: a transaction that fails
// with a Transient error is rolled back and run again from the start.
func (db *DB) TxRetry(ctx context.Context, r Retry, fn func(tx *sql.Tx) error) error {
	return r.Do(ctx, func() error { return db.Tx(ctx, fn) })
}

// LockClause is what follows a SELECT to lock the rows it reads until the
// transaction ends: " FOR UPDATE" on PostgreSQL, nothing on SQLite, whose
// one writer connection already serialises every write transaction.
func (db *DB) LockClause() string {
	if db.Dialect == Postgres {
		return " FOR UPDATE"
	}
	return ""
}
