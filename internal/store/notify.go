package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/stdlib"
)

// ErrNoNotify is returned by Listen on a database without notifications
// (SQLite): callers fall back to polling.
var ErrNoNotify = errors.New("store: this database has no LISTEN/NOTIFY")

// Notify sends payload on a PostgreSQL notification channel; on SQLite it
// does nothing (a single process shares its in-process bus).
func (db *DB) Notify(ctx context.Context, channel, payload string) error {
	if db.Dialect != Postgres {
		return nil
	}
	if _, err := db.ExecContext(ctx, `SELECT pg_notify($1, $2)`, channel, payload); err != nil {
		return fmt.Errorf("store: notify: %w", err)
	}
	return nil
}

// Listen holds one connection LISTENing on channel and calls fn with each
// payload until ctx ends or the connection fails (the caller restarts it).
func (db *DB) Listen(ctx context.Context, channel string, fn func(payload string)) error {
	if db.Dialect != Postgres {
		return ErrNoNotify
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("store: listen: %w", err)
	}
	defer conn.Close()
	return conn.Raw(func(driverConn any) error {
		c, ok := driverConn.(*stdlib.Conn)
		if !ok {
			return errors.New("store: listen: not a pgx connection")
		}
		pc := c.Conn()
		if _, err := pc.Exec(ctx, "LISTEN "+quoteIdent(channel)); err != nil {
			return fmt.Errorf("store: listen: %w", err)
		}
		for {
			n, err := pc.WaitForNotification(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("store: wait for notification: %w", err)
			}
			fn(n.Payload)
		}
	})
}

// quoteIdent quotes a PostgreSQL identifier.
func quoteIdent(s string) string {
	out := []byte{'"'}
	for i := 0; i < len(s); i++ {
		if s[i] == '"' {
			out = append(out, '"')
		}
		out = append(out, s[i])
	}
	return string(append(out, '"'))
}
