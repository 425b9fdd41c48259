package store

import "context"

// LockMigrations exposes the migration lock to the package's tests.
func (db *DB) LockMigrations(ctx context.Context) (func(), error) { return db.lockMigrations(ctx) }

// PathOf is the SQLite file behind db (benchmarks open it without the
// statement cache as their baseline).
func PathOf(db *DB) string { return db.path }
