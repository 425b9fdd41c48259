package signing

import (
	"context"
	"crypto/x509"
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
	sqlCurrentKey = `SELECT id, cert_der, sealed_key FROM worker_keys WHERE not_after > $1 ORDER BY not_after DESC LIMIT 8`
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

// readCurrentKey reads the newest worker key valid after validAfter whose
// certificate root issued (of the eight newest).
func readCurrentKey(ctx context.Context, db *store.DB, validAfter time.Time, root *x509.Certificate) (storedKey, bool, error) {
	rows, err := db.QueryContext(ctx, sqlCurrentKey, validAfter.UnixMilli())
	if err != nil {
		return storedKey{}, false, fmt.Errorf("signing: read worker key: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k storedKey
		if err := rows.Scan(&k.id, &k.cert, &k.sealed); err != nil {
			return storedKey{}, false, fmt.Errorf("signing: read worker key: %w", err)
		}
		if certifiedBy(k.cert, root) {
			return k, true, rows.Err()
		}
	}
	if err := rows.Err(); err != nil {
		return storedKey{}, false, fmt.Errorf("signing: read worker key: %w", err)
	}
	return storedKey{}, false, nil
}

// certifiedBy reports whether the worker certificate der was issued by
// root: after the command root rotates, a worker makes a key certified by
// the new root rather than keep signing under the old one (and, while
// processes with either root run side by side, each uses its own root's).
func certifiedBy(der []byte, root *x509.Certificate) bool {
	c, err := x509.ParseCertificate(der)
	return err == nil && c.CheckSignatureFrom(root) == nil
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
