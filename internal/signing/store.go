package signing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
)

// The signer's own tables: worker_keys and time_statements. The commands
// it signs are read and written through commands.Store.
const (
	sqlCurrentKey = `SELECT id, cert_der, sealed_key FROM worker_keys WHERE not_after > $1 ORDER BY not_after DESC LIMIT 1`
	sqlInsertKey  = `INSERT INTO worker_keys (id, cert_der, sealed_key, not_after, created_at) VALUES ($1, $2, $3, $4, $5)`
	// sqlStoreTime keeps the newest statement as the one row 'latest'.
	sqlStoreTime = `INSERT INTO time_statements (id, body, signature, signer_cert, time_ms) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET body = excluded.body, signature = excluded.signature, signer_cert = excluded.signer_cert, time_ms = excluded.time_ms
		WHERE time_statements.time_ms < excluded.time_ms`
	sqlLatestTime = `SELECT body, signature, signer_cert FROM time_statements WHERE id = $1`
	// sqlResealPage reads the next page of worker keys, expired or not,
	// after an id, for a KEK rotation.
	sqlResealPage = `SELECT id, sealed_key FROM worker_keys WHERE id > $1 ORDER BY id LIMIT $2`
	// sqlResealRow replaces one key's sealed form, only if it is still the
	// one read.
	sqlResealRow = `UPDATE worker_keys SET sealed_key = $1 WHERE id = $2 AND sealed_key = $3`
)

// latestTimeID is the id of the one time_statements row.
const latestTimeID = "latest"

// storedKey is a worker_keys row: the key's id, certificate and sealed
// private key.
type storedKey struct {
	id     string
	cert   []byte
	sealed []byte
}

// readCurrentKey reads the worker key that is valid after validAfter and
// runs longest; ok is false when there is none.
func readCurrentKey(ctx context.Context, db *store.DB, validAfter time.Time) (storedKey, bool, error) {
	var k storedKey
	err := db.QueryRowContext(ctx, sqlCurrentKey, validAfter.UnixMilli()).Scan(&k.id, &k.cert, &k.sealed)
	if errors.Is(err, sql.ErrNoRows) {
		return storedKey{}, false, nil
	}
	if err != nil {
		return storedKey{}, false, fmt.Errorf("signing: read worker key: %w", err)
	}
	return k, true, nil
}

// insertKey stores a new worker key valid until notAfter.
func insertKey(ctx context.Context, db *store.DB, k storedKey, notAfter, now time.Time) error {
	if _, err := db.ExecContext(ctx, sqlInsertKey, k.id, k.cert, k.sealed, notAfter.UnixMilli(), now.UnixMilli()); err != nil {
		return fmt.Errorf("signing: store worker key: %w", err)
	}
	return nil
}

// storeTime stores st, stated at, as the latest time statement unless a
// newer one is stored.
func storeTime(ctx context.Context, db *store.DB, st *nodev1.SignedTimeStatement, at time.Time) error {
	if _, err := db.ExecContext(ctx, sqlStoreTime, latestTimeID, st.Body, st.Signature, st.SignerCertDer, at.UnixMilli()); err != nil {
		return fmt.Errorf("signing: store time statement: %w", err)
	}
	return nil
}

// LatestTimeStatement returns the newest stored time statement, or nil
// when the workers have signed none yet. It reads only signed bytes, so
// a process without keys (the gateway's services) can relay it.
func LatestTimeStatement(ctx context.Context, db *store.DB) (*nodev1.SignedTimeStatement, error) {
	st := &nodev1.SignedTimeStatement{}
	err := db.QueryRowContext(ctx, sqlLatestTime, latestTimeID).Scan(&st.Body, &st.Signature, &st.SignerCertDer)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("signing: read time statement: %w", err)
	}
	return st, nil
}
