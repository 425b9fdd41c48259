package sandboxes

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// TestResealEnv: a KEK rotation moves every template's sealed env to the
// new key and seals a plain (pre-sealing) one; a second run finds both
// done; the envs open under the new key only.
func TestResealEnv(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		now := time.UnixMilli(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixMilli()).UTC()
		old, next := pki.KEK{1}, pki.KEK{2}
		for i, plain := range []bool{false, true} {
			tpl, env, labels, err := newTemplate(TemplateIn{Name: fmt.Sprintf("t%d", i), Image: "busybox", Env: map[string]string{"A": "v"}},
				fmt.Sprintf("tpl_%d", i), iam.RootTenant, "idn_1", now)
			if err != nil {
				t.Fatal(err)
			}
			tpl.ImageDigest = "sha256:" + fmt.Sprintf("%064x", 1)
			col := string(env)
			if !plain {
				if col, err = (&Service{kek: old}).sealEnv(tpl.TenantID, tpl.ID, env); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := db.ExecContext(ctx, sqlInsertTemplate, templateArgs(tpl, col, labels, now)...); err != nil {
				t.Fatal(err)
			}
		}
		if c, err := ResealEnv(ctx, db, old, next); err != nil || c.Resealed != 2 || c.AlreadyDone != 0 {
			t.Fatalf("first run %+v %v", c, err)
		}
		if c, err := ResealEnv(ctx, db, old, next); err != nil || c.Resealed != 0 || c.AlreadyDone != 2 {
			t.Fatalf("second run %+v %v", c, err)
		}
		for i := range 2 {
			var col string
			id := fmt.Sprintf("tpl_%d", i)
			if err := db.QueryRowContext(ctx, `SELECT env FROM sandbox_templates WHERE id = $1`, id).Scan(&col); err != nil {
				t.Fatal(err)
			}
			if env, err := (&Service{kek: next}).openEnv(iam.RootTenant, id, col); err != nil || env["A"] != "v" {
				t.Fatalf("%s under the new key: %v %v", id, env, err)
			}
			if _, err := (&Service{kek: old}).openEnv(iam.RootTenant, id, col); err == nil {
				t.Fatalf("%s still opens under the old key", id)
			}
		}
	})
}
