package bastions

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/bettercompute/bettercompute/internal/bastion/grant"
	"github.com/bettercompute/bettercompute/internal/bastion/wgtun"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
)

// The control plane's bastion keys (bastion_keys.name).
const (
	keyGrant = "grant" // the note signing key of grants (grant.GenerateKey)
	keyLanes = "lanes" // the control plane's WireGuard key (wgtun.GenerateKey)
)

// keyAAD binds a sealed key to its row: a sealed grant key copied into the
// lanes row (or the reverse) does not open.
func keyAAD(name string) []byte { return []byte("bc-bastion-key-v1\x00" + name) }

// newKey makes the key of name: its private half (to seal) and its public
// half (stored in the clear).
func newKey(name string) (private []byte, public string, err error) {
	switch name {
	case keyGrant:
		skey, vkey, err := grant.GenerateKey()
		if err != nil {
			return nil, "", fmt.Errorf("bastions: make grant key: %w", err)
		}
		return []byte(skey), vkey, nil
	case keyLanes:
		k, err := wgtun.GenerateKey()
		if err != nil {
			return nil, "", fmt.Errorf("bastions: make lanes key: %w", err)
		}
		return []byte(k.String()), k.Public().String(), nil
	}
	return nil, "", fmt.Errorf("bastions: unknown key %q", name)
}

// ensureKey makes the key of name unless it exists: a process that loses
// the race to store it keeps the winner's.
func (s *Service) ensureKey(ctx context.Context, name string) (sealed []byte, public string, err error) {
	err = s.db.QueryRowContext(ctx, sqlReadKey, name).Scan(&sealed, &public)
	if err == nil {
		return sealed, public, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, "", fmt.Errorf("bastions: read %s key: %w", name, err)
	}
	priv, pub, err := newKey(name)
	if err != nil {
		return nil, "", err
	}
	defer clear(priv)
	sealed, err = pki.Seal(s.kek, priv, keyAAD(name))
	if err != nil {
		return nil, "", fmt.Errorf("bastions: seal %s key: %w", name, err)
	}
	if _, err := s.db.ExecContext(ctx, sqlInsertKey, name, sealed, pub, s.clk.Now().UnixMilli()); err != nil {
		return nil, "", fmt.Errorf("bastions: store %s key: %w", name, err)
	}
	if err := s.db.QueryRowContext(ctx, sqlReadKey, name).Scan(&sealed, &public); err != nil {
		return nil, "", fmt.Errorf("bastions: read %s key: %w", name, err)
	}
	return sealed, public, nil
}

// publicKey returns the public half of the key of name, making the key on
// first use.
func (s *Service) publicKey(ctx context.Context, name string) (string, error) {
	_, pub, err := s.ensureKey(ctx, name)
	return pub, err
}

// privateKey returns the opened private half of the key of name (the
// caller clears it), making the key on first use.
func (s *Service) privateKey(ctx context.Context, name string) ([]byte, error) {
	sealed, _, err := s.ensureKey(ctx, name)
	if err != nil {
		return nil, err
	}
	priv, err := pki.Open(s.kek, sealed, keyAAD(name))
	if err != nil {
		return nil, fmt.Errorf("bastions: open %s key: %w", name, err)
	}
	return priv, nil
}

// GrantVerifyKey returns the note verifier key of the grant key (made and
// sealed on first use): what a bastion pins at pairing and verifies every
// grant under.
func (s *Service) GrantVerifyKey(ctx context.Context) (string, error) {
	return s.publicKey(ctx, keyGrant)
}

// LanesKey returns the control plane's WireGuard key (made and sealed on
// first use): the private key, for the lanes role's tunnel end only, and
// the public key (base64) every bastion is told at its hello.
func (s *Service) LanesKey(ctx context.Context) (private wgtun.Key, public string, err error) {
	priv, err := s.privateKey(ctx, keyLanes)
	if err != nil {
		return wgtun.Key{}, "", err
	}
	defer clear(priv)
	k, err := wgtun.ParseKey(string(priv))
	if err != nil {
		return wgtun.Key{}, "", errors.New("bastions: the sealed lanes key is not a WireGuard key")
	}
	return k, k.Public().String(), nil
}

// ErrChangedDuringReseal is returned when a key changed between Reseal's
// read and its write: a control plane process is still running.
var ErrChangedDuringReseal = errors.New("a bastion key changed while it was being re-sealed; stop the api and workers processes and run the rotation again")

// Reseal moves every sealed bastion key from the key-encryption key old to
// next, each under its own aad, in one transaction. A key that already
// opens under next is counted done (an interrupted run is finished by
// running it again); one that opens under neither stops it with an error
// naming the key and wrapping pki.ErrNotUnderEitherKey, and nothing
// changes.
func Reseal(ctx context.Context, db *store.DB, old, next pki.KEK) (pki.RekeyCount, error) {
	var c pki.RekeyCount
	if err := pki.CheckRekeyPair(old, next); err != nil {
		return c, err
	}
	err := db.Tx(ctx, func(tx *sql.Tx) error {
		c = pki.RekeyCount{}
		rows, err := readSealedKeys(ctx, tx)
		if err != nil {
			return err
		}
		for _, r := range rows {
			out, changed, err := pki.Reseal(old, next, r.sealed, keyAAD(r.name))
			if err != nil {
				return fmt.Errorf("bastions: table bastion_keys, key %s: %w", r.name, err)
			}
			if !changed {
				c.AlreadyDone++
				continue
			}
			res, err := tx.ExecContext(ctx, sqlResealKey, out, r.name, r.sealed)
			if err != nil {
				return fmt.Errorf("bastions: reseal key %s: %w", r.name, err)
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				return fmt.Errorf("bastions: table bastion_keys, key %s: %w", r.name, ErrChangedDuringReseal)
			}
			c.Resealed++
		}
		return nil
	})
	return c, err
}

// sealedKey is one bastion_keys row as Reseal reads it.
type sealedKey struct {
	name   string
	sealed []byte
}

// readSealedKeys reads every sealed key (there are two).
func readSealedKeys(ctx context.Context, tx *sql.Tx) ([]sealedKey, error) {
	rows, err := tx.QueryContext(ctx, sqlResealKeys)
	if err != nil {
		return nil, fmt.Errorf("bastions: reseal: read: %w", err)
	}
	defer rows.Close()
	var out []sealedKey
	for rows.Next() {
		var k sealedKey
		if err := rows.Scan(&k.name, &k.sealed); err != nil {
			return nil, fmt.Errorf("bastions: reseal: read: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}
