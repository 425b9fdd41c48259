package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"

	"modernc.org/sqlite"
)

// SQLite statement cache.
//
// modernc.org/sqlite parses every statement it is given afresh; on the
// control plane's small queries parsing is most of the cost (a warm claim
// spent more time in sqlite3_prepare than in executing its statements).
// database/sql has no statement cache of its own, and wrapping every
// query site in Prepare would touch every module, so each SQLite
// connection keeps its own prepared statements, keyed by their text, and
// reuses one when the same text comes again and the statement is not in
// use (an open result set); the driver resets a reused statement and its
// bindings after each use. SQLite re-prepares a cached statement by
// itself when the schema changes under it. Texts longer than
// maxCachedQuery or holding ';' (scripts: migrations) are never cached,
// and a connection caches at most maxCachedStmts texts (a new one evicts a
// random idle one), so statements built at run time (IN lists) cannot
// grow it without bound.
const (
	maxCachedStmts = 512
	maxCachedQuery = 4096
)

// cachingConnector opens modernc SQLite connections that cache their
// statements.
type cachingConnector struct {
	dsn string
	drv *sqlite.Driver
}

// Connect opens one connection.
func (c cachingConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return newCachingConn(conn)
}

// Driver returns the underlying driver.
func (c cachingConnector) Driver() driver.Driver { return c.drv }

// sqliteConn is what the modernc connection implements and database/sql
// uses.
type sqliteConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
}

// cachingConn is one SQLite connection with its statement cache.
// database/sql uses a connection from one goroutine at a time, so the
// cache needs no lock of its own; mu only guards Close against a
// statement still being prepared (it never is, by that contract).
type cachingConn struct {
	sqliteConn
	mu    sync.Mutex
	stmts map[string]*cachedStmt
}

// cachedStmt is a prepared statement and whether a result set of it is
// open.
type cachedStmt struct {
	st   driver.Stmt
	busy bool
}

func newCachingConn(c driver.Conn) (*cachingConn, error) {
	sc, ok := c.(sqliteConn)
	if !ok {
		c.Close()
		return nil, errors.New("store: the sqlite driver's connection lacks an interface the cache needs")
	}
	return &cachingConn{sqliteConn: sc, stmts: map[string]*cachedStmt{}}, nil
}

// take returns the free cached statement for query, preparing it when it
// is cacheable and not yet cached; nil means run query unprepared.
func (c *cachingConn) take(ctx context.Context, query string) *cachedStmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cs, ok := c.stmts[query]; ok {
		if cs.busy {
			return nil
		}
		cs.busy = true
		return cs
	}
	if len(query) > maxCachedQuery || strings.Contains(query, ";") {
		return nil
	}
	if len(c.stmts) >= maxCachedStmts && !c.evictOne() {
		return nil
	}
	st, err := c.sqliteConn.PrepareContext(ctx, query)
	if err != nil {
		return nil // the unprepared path reports the error
	}
	cs := &cachedStmt{st: st, busy: true}
	c.stmts[query] = cs
	return cs
}

// evictOne closes and forgets one cached statement not in use (Go's map
// order makes it a random one), so that texts seen after the cache filled
// are cached too; false when every cached statement is in use.
func (c *cachingConn) evictOne() bool {
	for q, cs := range c.stmts {
		if !cs.busy {
			cs.st.Close()
			delete(c.stmts, q)
			return true
		}
	}
	return false
}

func (c *cachingConn) release(cs *cachedStmt) {
	c.mu.Lock()
	cs.busy = false
	c.mu.Unlock()
}

// ExecContext runs query on its cached statement when it can.
func (c *cachingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	cs := c.take(ctx, query)
	if cs == nil {
		return c.sqliteConn.ExecContext(ctx, query, args)
	}
	defer c.release(cs)
	return cs.st.(driver.StmtExecContext).ExecContext(ctx, args)
}

// QueryContext runs query on its cached statement when it can; the
// statement is free again once its rows are closed.
func (c *cachingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	cs := c.take(ctx, query)
	if cs == nil {
		return c.sqliteConn.QueryContext(ctx, query, args)
	}
	rows, err := cs.st.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		c.release(cs)
		return nil, err
	}
	return &cachedRows{Rows: rows, done: func() { c.release(cs) }}, nil
}

// Close finalizes the cached statements and closes the connection.
func (c *cachingConn) Close() error {
	c.mu.Lock()
	for q, cs := range c.stmts {
		cs.st.Close()
		delete(c.stmts, q)
	}
	c.mu.Unlock()
	return c.sqliteConn.Close()
}

// cachedRows frees its statement when closed.
type cachedRows struct {
	driver.Rows
	once sync.Once
	done func()
}

func (r *cachedRows) Close() error {
	err := r.Rows.Close()
	r.once.Do(r.done)
	return err
}
