package secrets

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
)

// resealBatch is how many versions one transaction of Reseal visits.
const resealBatch = 100

// ErrChangedDuringReseal is returned when a row changed between Reseal's
// read and its write: a control plane process is still running.
var ErrChangedDuringReseal = errors.New("a sealed value changed while it was being re-sealed; stop the api and workers processes and run the rotation again")

// resealRow is one version as Reseal reads it.
type resealRow struct {
	ref, tenant string
	version     int64
	sealed      []byte
}

// Reseal moves every sealed secret value, every version, live or deleted,
// from the key-encryption key old to next, each under its own aad (ref,
// tenant, version), in transactions of up to resealBatch versions. A value
// that already opens under next is counted done, so a run interrupted
// part-way is finished by running it again. A value that opens under
// neither key stops it with an error naming its reference and version and
// wrapping pki.ErrNotUnderEitherKey; that batch is rolled back and nothing
// after it changes.
func Reseal(ctx context.Context, db *store.DB, old, next pki.KEK) (pki.RekeyCount, error) {
	var total pki.RekeyCount
	if err := pki.CheckRekeyPair(old, next); err != nil {
		return total, err
	}
	after := resealRow{}
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
				after = rows[n-1]
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

// readResealPage reads the versions after (after.ref, after.version).
func readResealPage(ctx context.Context, tx *sql.Tx, after resealRow) ([]resealRow, error) {
	rows, err := tx.QueryContext(ctx, sqlResealPage, after.ref, after.version, resealBatch)
	if err != nil {
		return nil, fmt.Errorf("secrets: reseal: read: %w", err)
	}
	defer rows.Close()
	var out []resealRow
	for rows.Next() {
		var r resealRow
		if err := rows.Scan(&r.ref, &r.version, &r.tenant, &r.sealed); err != nil {
			return nil, fmt.Errorf("secrets: reseal: read: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("secrets: reseal: read: %w", err)
	}
	return out, nil
}

// resealRows re-seals rows from old to next within tx.
func resealRows(ctx context.Context, tx *sql.Tx, old, next pki.KEK, rows []resealRow) (pki.RekeyCount, error) {
	var c pki.RekeyCount
	for _, r := range rows {
		out, changed, err := pki.Reseal(old, next, r.sealed, aad(r.ref, r.tenant, r.version))
		if err != nil {
			return c, fmt.Errorf("secrets: table secrets, %s version %d: %w", r.ref, r.version, err)
		}
		if !changed {
			c.AlreadyDone++
			continue
		}
		res, err := tx.ExecContext(ctx, sqlResealRow, out, r.ref, r.version, r.sealed)
		if err != nil {
			return c, fmt.Errorf("secrets: reseal %s version %d: %w", r.ref, r.version, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return c, fmt.Errorf("secrets: table secrets, %s version %d: %w", r.ref, r.version, ErrChangedDuringReseal)
		}
		c.Resealed++
	}
	return c, nil
}
