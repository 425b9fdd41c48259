package apikeys

import (
	"context"
	"database/sql"
	"fmt"
	"slices"

	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/store"
)

// maker is the credential a caller presented, recorded as the maker of
// what it makes: its session when it is one, else its key ("" for the
// server itself).
func maker(p Principal) string {
	if p.SessionID != "" {
		return p.SessionID
	}
	return p.KeyID
}

// holdMaker checks, inside tx, that the maker credential (a session when
// session, else a key) is unrevoked, and holds its row until tx ends: a revocation
// of it waits, and a revocation that committed first is seen (PostgreSQL
// re-reads the row it waited for), so nothing is made from a credential
// whose revocation has already cascaded to what it made.
func holdMaker(ctx context.Context, tx *sql.Tx, session bool, id, tenant, identity string) (bool, error) {
	q := qHoldKey
	if session {
		q = qHoldSession
	}
	res, err := tx.ExecContext(ctx, q, id, tenant, identity)
	if err != nil {
		return false, fmt.Errorf("apikeys: hold maker: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("apikeys: hold maker: %w", err)
	}
	return n == 1, nil
}

// RevokeMadeBy revokes, inside tx at time at (unix ms), everything made
// from the credentials ids (key or session ids, which never collide, already revoked by the
// caller), at any depth: the sessions of a key, the sessions a session
// made, and the keys a key or a session made (api_keys.made_by), then what
// those made, until nothing unrevoked is left. It returns how many keys
// and sessions it revoked as the revocation feed's entries (reason
// ReasonMadeBy), which the caller appends (revocations.AppendTx) last in
// the same transaction. Every revocation of a key or session calls it in
// the same transaction.
func RevokeMadeBy(ctx context.Context, tx *sql.Tx, d store.Dialect, at int64, ids []string) (made []revwire.Entry, err error) {
	frontier := slices.Clone(ids)
	for len(frontier) > 0 {
		var next []string
		for chunk := range slices.Chunk(frontier, store.InChunk/2) {
			k, err := revokeWhere(ctx, tx, d, at, tableKeys, func(a *store.Args) string { return keysMadeBy(a, chunk) })
			if err != nil {
				return nil, err
			}
			s, err := revokeWhere(ctx, tx, d, at, tableSessions, func(a *store.Args) string { return sessionsMadeBy(a, chunk) })
			if err != nil {
				return nil, err
			}
			made = append(made, credEntries(revwire.KindAPIKey, k, at, ReasonMadeBy)...)
			made = append(made, credEntries(revwire.KindSession, s, at, ReasonMadeBy)...)
			next = append(append(next, credIDs(k)...), credIDs(s)...)
		}
		frontier = next
	}
	return made, nil
}

// revokeWhere revokes the unrevoked rows of table matching the condition
// cond builds and returns their ids and tenants.
func revokeWhere(ctx context.Context, tx *sql.Tx, d store.Dialect, at int64, table string, cond func(*store.Args) string) ([]cred, error) {
	a := store.NewArgsFor(d)
	rows, err := tx.QueryContext(ctx, selectUnrevoked(table, cond(a)), a.Values()...)
	if err != nil {
		return nil, fmt.Errorf("apikeys: read made credentials: %w", err)
	}
	found, err := scanCreds(rows)
	if err != nil {
		return nil, fmt.Errorf("apikeys: read made credentials: %w", err)
	}
	for chunk := range slices.Chunk(credIDs(found), store.InChunk) {
		a := store.NewArgsFor(d)
		at := a.Add(at)
		if _, err := tx.ExecContext(ctx, revokeIDs(table, at, a.Strings(chunk)), a.Values()...); err != nil {
			return nil, fmt.Errorf("apikeys: revoke made credentials: %w", err)
		}
	}
	return found, nil
}
