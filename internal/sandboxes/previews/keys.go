package previews

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previewtoken"
	"github.com/bettercompute/bettercompute/internal/store"
)

// slotCurrent is the one row of sandbox_preview_keys.
const slotCurrent = "current"

const (
	sqlReadKey = `SELECT kid, sealed, public_key FROM sandbox_preview_keys WHERE slot = $1`
	// sqlInsertKey stores the first key unless another process stored one
	// first (the winner's is kept).
	sqlInsertKey = `INSERT INTO sandbox_preview_keys (slot, kid, sealed, public_key, created_at_ms) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (slot) DO NOTHING`
	// sqlRotateKey replaces the key.
	sqlRotateKey = `UPDATE sandbox_preview_keys SET kid = $2, sealed = $3, public_key = $4, created_at_ms = $5 WHERE slot = $1`
	// sqlResealKey re-seals the key for a KEK rotation, unless it changed.
	sqlResealKey = `UPDATE sandbox_preview_keys SET sealed = $3 WHERE slot = $1 AND sealed = $2`
)

// keyAAD binds a sealed seed to its key id: a sealed seed copied under
// another key id does not open.
func keyAAD(kid string) []byte { return []byte("bc-preview-key-v1\x00" + kid) }

// Keys keeps the preview key: made on first use, sealed at rest under the
// KEK, rotated on demand.
type Keys struct {
	db  *store.DB
	kek pki.KEK
	clk clock.Clock
}

// NewKeys returns the preview key store of db, sealed under kek.
func NewKeys(db *store.DB, kek pki.KEK, clk clock.Clock) *Keys {
	return &Keys{db: db, kek: kek, clk: clk}
}

// row is the stored key.
type row struct {
	kid    string
	sealed []byte
	public []byte
}

// errNoKey: no preview key was made yet, so no token can verify.
var errNoKey = errors.New("previews: no preview key yet")

// stored returns the stored key, errNoKey when there is none.
func (k *Keys) stored(ctx context.Context) (row, error) {
	var r row
	err := k.db.QueryRowContext(ctx, sqlReadKey, slotCurrent).Scan(&r.kid, &r.sealed, &r.public)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return row{}, errNoKey
	case err != nil:
		return row{}, fmt.Errorf("previews: read key: %w", err)
	}
	return r, nil
}

// read returns the stored key, making and storing one when there is none.
func (k *Keys) read(ctx context.Context) (row, error) {
	r, err := k.stored(ctx)
	if !errors.Is(err, errNoKey) {
		return r, err
	}
	fresh, err := k.newRow()
	if err != nil {
		return row{}, err
	}
	if _, err := k.db.ExecContext(ctx, sqlInsertKey, slotCurrent, fresh.kid, fresh.sealed, fresh.public, k.clk.Now().UnixMilli()); err != nil {
		return row{}, fmt.Errorf("previews: store key: %w", err)
	}
	if err := k.db.QueryRowContext(ctx, sqlReadKey, slotCurrent).Scan(&r.kid, &r.sealed, &r.public); err != nil {
		return row{}, fmt.Errorf("previews: read key: %w", err)
	}
	return r, nil
}

// newRow makes a fresh key, sealed.
func (k *Keys) newRow() (row, error) {
	key, err := previewtoken.GenerateKey(rand.Reader)
	if err != nil {
		return row{}, err
	}
	seed := key.MarshalSeed()
	defer clear(seed)
	sealed, err := pki.Seal(k.kek, seed, keyAAD(key.ID()))
	if err != nil {
		return row{}, fmt.Errorf("previews: seal key: %w", err)
	}
	return row{kid: key.ID(), sealed: sealed, public: key.PublicKey()}, nil
}

// Signing returns the current preview key, opened (for sandboxes.preview
// only).
func (k *Keys) Signing(ctx context.Context) (previewtoken.Key, error) {
	r, err := k.read(ctx)
	if err != nil {
		return previewtoken.Key{}, err
	}
	seed, err := pki.Open(k.kek, r.sealed, keyAAD(r.kid))
	if err != nil {
		return previewtoken.Key{}, fmt.Errorf("previews: open key: %w", err)
	}
	defer clear(seed)
	key, err := previewtoken.KeyFromSeed(seed)
	if err != nil || key.ID() != r.kid {
		return previewtoken.Key{}, errors.New("previews: the sealed preview key does not match its key id")
	}
	return key, nil
}

// Verifier returns a verifier of the current preview key only: read
// again on every call, so a rotation in any process takes effect at the
// next request everywhere. It never makes a key (a request to the proxy
// is unauthenticated): with none yet it answers errNoKey.
func (k *Keys) Verifier(ctx context.Context) (*previewtoken.Verifier, error) {
	r, err := k.stored(ctx)
	if err != nil {
		return nil, err
	}
	return previewtoken.NewVerifierFromPublic(ed25519.PublicKey(r.public))
}

// Reseal re-seals the stored preview key from the KEK old to next (a KEK
// rotation); a key already sealed under next is left as it is.
func Reseal(ctx context.Context, db *store.DB, old, next pki.KEK) (pki.RekeyCount, error) {
	var c pki.RekeyCount
	var r row
	err := db.QueryRowContext(ctx, sqlReadKey, slotCurrent).Scan(&r.kid, &r.sealed, &r.public)
	if errors.Is(err, sql.ErrNoRows) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("previews: read key: %w", err)
	}
	if seed, err := pki.Open(next, r.sealed, keyAAD(r.kid)); err == nil {
		clear(seed)
		c.AlreadyDone++
		return c, nil
	}
	seed, err := pki.Open(old, r.sealed, keyAAD(r.kid))
	if err != nil {
		return c, fmt.Errorf("previews: open key under the old KEK: %w", err)
	}
	defer clear(seed)
	sealed, err := pki.Seal(next, seed, keyAAD(r.kid))
	if err != nil {
		return c, fmt.Errorf("previews: seal key: %w", err)
	}
	res, err := db.ExecContext(ctx, sqlResealKey, slotCurrent, r.sealed, sealed)
	if err != nil {
		return c, fmt.Errorf("previews: re-seal key: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return c, errors.New("previews: the preview key changed while it was being re-sealed; stop the control plane and run the rotation again")
	}
	c.Resealed++
	return c, nil
}
