// Package spentdb is the gateways' spent-ticket store: the jtis of the
// tickets accepted, in the database (table tickets_spent, migration
// tickets/migrations/0032), so that a ticket is accepted once across every
// gateway that shares the database, on SQLite and PostgreSQL alike. The
// primary key decides: of two spends of one jti, however concurrent, the
// database lets one insert and refuses the other with a unique violation.
//
// It is apart from package tickets so that bcd, which imports tickets for
// Verify and its in-memory store, links no database driver.
package spentdb

import (
	"context"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

const (
	// sqlSpend spends a jti; a second insert of it is a replay.
	sqlSpend = `INSERT INTO tickets_spent (jti, expires_at_ms) VALUES ($1, $2)`
	// sqlSweep forgets the jtis whose tickets expired before $1.
	sqlSweep = `DELETE FROM tickets_spent WHERE expires_at_ms < $1`
)

// Store spends jtis in the database. It implements tickets.Spent.
type Store struct {
	db *store.DB
}

// New returns the store on db, which must be migrated.
func New(db *store.DB) *Store { return &Store{db: db} }

// Spend records jti, whose ticket expires at expires. It returns
// tickets.ErrSpent when jti was recorded before, and a wrapped database
// error when it cannot record it (the caller refuses the ticket then).
func (s *Store) Spend(ctx context.Context, jti string, expires time.Time) error {
	if _, err := s.db.ExecContext(ctx, sqlSpend, jti, expires.UnixMilli()); err != nil {
		if store.IsUniqueViolation(err) {
			return tickets.ErrSpent
		}
		return fmt.Errorf("spentdb: spend ticket: %w", err)
	}
	return nil
}

// Sweep deletes the jtis whose tickets expired more than
// tickets.Retention before now, which every verifier refuses as expired by
// then, and returns how many it deleted. Run it periodically; without it
// the table only grows.
func (s *Store) Sweep(ctx context.Context, now time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, sqlSweep, now.Add(-tickets.Retention).UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("spentdb: sweep spent tickets: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("spentdb: sweep spent tickets: %w", err)
	}
	return n, nil
}
