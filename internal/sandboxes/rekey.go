package sandboxes

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
)

// The statements of ResealEnv.
const (
	sqlResealEnvRead = `SELECT id, tenant_id, env FROM sandbox_templates ORDER BY id`
	sqlResealEnvRow  = `UPDATE sandbox_templates SET env = $1 WHERE id = $2 AND env = $3`
)

// ErrEnvChangedDuringReseal is returned when a template's env changed
// between ResealEnv's read and its write: a control plane process is
// still running.
var ErrEnvChangedDuringReseal = errors.New("a template's environment changed while it was being re-sealed; stop the api and workers processes and run the rotation again")

// ResealEnv moves every template's sealed environment from the
// key-encryption key old to next (pki rotate-kek), in one transaction;
// an environment written plain before sealing is sealed under next. An
// environment already under next counts done, so an interrupted rotation
// is finished by running it again; one that opens under neither key stops
// it, naming the template, and nothing changes.
func ResealEnv(ctx context.Context, db *store.DB, old, next pki.KEK) (pki.RekeyCount, error) {
	var c pki.RekeyCount
	if err := pki.CheckRekeyPair(old, next); err != nil {
		return c, err
	}
	err := db.Tx(ctx, func(tx *sql.Tx) error {
		type row struct{ id, tenant, col string }
		rows, err := tx.QueryContext(ctx, sqlResealEnvRead)
		if err != nil {
			return fmt.Errorf("sandboxes: reseal env: read: %w", err)
		}
		var all []row
		for rows.Next() {
			var r row
			if err := rows.Scan(&r.id, &r.tenant, &r.col); err != nil {
				rows.Close()
				return fmt.Errorf("sandboxes: reseal env: read: %w", err)
			}
			all = append(all, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("sandboxes: reseal env: read: %w", err)
		}
		for _, r := range all {
			out, changed, err := resealEnvCol(old, next, r.tenant, r.id, r.col)
			if err != nil {
				return fmt.Errorf("sandboxes: table sandbox_templates, template %s: %w", r.id, err)
			}
			if !changed {
				c.AlreadyDone++
				continue
			}
			res, err := tx.ExecContext(ctx, sqlResealEnvRow, out, r.id, r.col)
			if err != nil {
				return fmt.Errorf("sandboxes: reseal env of template %s: %w", r.id, err)
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				return fmt.Errorf("sandboxes: template %s: %w", r.id, ErrEnvChangedDuringReseal)
			}
			c.Resealed++
		}
		return nil
	})
	return c, err
}

// resealEnvCol re-seals one env column from old to next (a plain one is
// sealed under next).
func resealEnvCol(old, next pki.KEK, tenant, id, col string) (string, bool, error) {
	b64, sealedCol := strings.CutPrefix(col, sealedEnvPrefix)
	if !sealedCol {
		out, err := (&Service{kek: next}).sealEnv(tenant, id, []byte(col))
		return out, err == nil, err
	}
	sealed, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return "", false, fmt.Errorf("sandboxes: env column: %w", err)
	}
	out, changed, err := pki.Reseal(old, next, sealed, envAAD(tenant, id))
	if err != nil || !changed {
		return "", false, err
	}
	return sealedEnvPrefix + base64.StdEncoding.EncodeToString(out), true, nil
}
