package signing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
)

// resealBatch is how many worker keys one transaction of Reseal visits.
const resealBatch = 100

// ErrChangedDuringReseal is returned when a worker key changed between
// Reseal's read and its write: a control plane process is still running.
var ErrChangedDuringReseal = errors.New("a worker key changed while it was being re-sealed; stop the api and workers processes and run the rotation again")

// resealRow is one worker key as Reseal reads it.
type resealRow struct {
	id     string
	sealed []byte
}

// Reseal moves every worker key's sealed private key, expired or not, from
// the key-encryption key old to next, each under its own aad (its id), in
// transactions of up to resealBatch keys. A key that already opens under
// next is counted done, so a run interrupted part-way is finished by
// running it again. A key that opens under neither stops it with an error
// naming the key's id and wrapping pki.ErrNotUnderEitherKey; that batch is
// rolled back and nothing after it changes.
func Reseal(ctx context.Context, db *store.DB, old, next pki.KEK) (pki.RekeyCount, error) {
	var total pki.RekeyCount
	if err := pki.CheckRekeyPair(old, next); err != nil {
		return total, err
	}
	after := ""
	for {
		var c pki.RekeyCount
		var n int
		err := db.Tx(ctx, func(tx *sql.Tx) error {
			rows, err := readResealPage(ctx, tx, after)
			if err != nil {
				return err
			}
			n = len(rows)
			if n > 0 {
				after = rows[n-1].id
			}
			c, err = resealRows(ctx, tx, old, next, rows)
			return err
		})
		if err != nil {
			return total, err
		}
		total.Add(c)
		if n < resealBatch {
			return total, nil
		}
	}
}

// readResealPage reads the worker keys whose id sorts after after.
func readResealPage(ctx context.Context, tx *sql.Tx, after string) ([]resealRow, error) {
	rows, err := tx.QueryContext(ctx, sqlResealPage, after, resealBatch)
	if err != nil {
		return nil, fmt.Errorf("signing: reseal: read: %w", err)
	}
	defer rows.Close()
	var out []resealRow
	for rows.Next() {
		var r resealRow
		if err := rows.Scan(&r.id, &r.sealed); err != nil {
			return nil, fmt.Errorf("signing: reseal: read: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("signing: reseal: read: %w", err)
	}
	return out, nil
}

// resealRows re-seals rows from old to next within tx.
func resealRows(ctx context.Context, tx *sql.Tx, old, next pki.KEK, rows []resealRow) (pki.RekeyCount, error) {
	var c pki.RekeyCount
	for _, r := range rows {
		out, changed, err := pki.Reseal(old, next, r.sealed, sealAAD(r.id))
		if err != nil {
			return c, fmt.Errorf("signing: table worker_keys, id %s: %w", r.id, err)
		}
		if !changed {
			c.AlreadyDone++
			continue
		}
		res, err := tx.ExecContext(ctx, sqlResealRow, out, r.id, r.sealed)
		if err != nil {
			return c, fmt.Errorf("signing: reseal worker key %s: %w", r.id, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return c, fmt.Errorf("signing: table worker_keys, id %s: %w", r.id, ErrChangedDuringReseal)
		}
		c.Resealed++
	}
	return c, nil
}
