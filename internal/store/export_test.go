package store

import "context"

// LockMigrations exposes the migration lock to the package's tests.
func (db *DB) LockMigrations(ctx context.Context) (func(), error) { return db.lockMigrations(ctx) }
