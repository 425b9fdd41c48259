package api_test

import (
	"context"
	"errors"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// A tenant's admin lists and proves its own tenant's audit events through
// the API (the proof checks offline under the deployment's audit key) and
// cannot reach another tenant's log: naming the other tenant is refused
// exactly as naming a tenant that does not exist, and the other tenant's
// event is NOT_FOUND exactly as a missing event.
func TestTenantAdminReadsOnlyItsOwnAuditLog(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		e := testenv.Start(t, db, testenv.Options{})
		a, adminA := e.TenantAdmin(t, "audit-a")
		b, adminB := e.TenantAdmin(t, "audit-b")
		if err := e.CP.Audit.SealOnce(ctx); err != nil {
			t.Fatal(err)
		}
		own, err := adminA.AuditList(ctx, "", 0, 0)
		if err != nil || len(own.Events) == 0 {
			t.Fatalf("own log: %+v %v", own, err)
		}
		theirs, err := adminB.AuditList(ctx, b, 0, 0)
		if err != nil || len(theirs.Events) == 0 {
			t.Fatalf("b's log: %+v %v", theirs, err)
		}
		ids := map[string]bool{}
		for _, ev := range own.Events {
			ids[ev.ID] = true
			if !ev.Sealed {
				t.Fatalf("event %s not sealed after SealOnce", ev.ID)
			}
		}
		for _, ev := range theirs.Events {
			if ids[ev.ID] {
				t.Fatalf("b's event %s in a's log", ev.ID)
			}
		}

		ev := own.Events[0]
		p, err := adminA.AuditProve(ctx, "", ev.ID)
		if err != nil || p.TenantID != a || p.EventID != ev.ID {
			t.Fatalf("prove own event: %+v %v", p, err)
		}
		vkey, err := auditlog.VerifierKey(e.Bundle.Deployment, e.Bundle.AuditKey)
		if err != nil {
			t.Fatal(err)
		}
		v, _, err := auditlog.ParseVerifierKey(vkey)
		if err != nil {
			t.Fatal(err)
		}
		got, err := auditlog.CheckProof([]byte(p.Proof), v)
		if err != nil || got.Row.ID != ev.ID || got.Row.TenantID != a {
			t.Fatalf("proof does not check: %+v %v", got.Row, err)
		}

		// Another tenant's log is refused as a missing tenant is.
		_, errOther := adminA.AuditList(ctx, b, 0, 0)
		_, errMissing := adminA.AuditList(ctx, "t_missing", 0, 0)
		if !errors.Is(errOther, client.ErrAccessDenied) || !errors.Is(errMissing, client.ErrAccessDenied) {
			t.Fatalf("other tenant: %v; missing tenant: %v; want ACCESS_DENIED both", errOther, errMissing)
		}
		if _, err := adminA.AuditProve(ctx, b, theirs.Events[0].ID); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("prove in b's tenant: %v, want ACCESS_DENIED", err)
		}
		// Another tenant's event, asked in one's own log, is missing.
		_, errOther = adminA.AuditProve(ctx, "", theirs.Events[0].ID)
		_, errMissing = adminA.AuditProve(ctx, "", "ev_missing")
		var eo, em *client.Error
		if !errors.As(errOther, &eo) || !errors.As(errMissing, &em) || eo.Code != "NOT_FOUND" || eo.Code != em.Code || eo.Message != em.Message || eo.Status != em.Status {
			t.Fatalf("b's event: %v; missing event: %v; want the same NOT_FOUND", errOther, errMissing)
		}
		if _, err := adminA.AuditProve(ctx, "", ""); !errors.Is(err, client.ErrInvalidInput) {
			t.Fatalf("no event id: %v, want INVALID_INPUT", err)
		}
	})
}
