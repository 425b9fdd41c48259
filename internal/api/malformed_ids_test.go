package api_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestImpossibleIDsAnswerAsMissing: an id no resource can have (a NUL,
// bytes that are not UTF-8) in a query string answers and is audited as a
// missing one on both databases: 403 ACCESS_DENIED for a tenant's caller
// and one out-of-reach row that holds none of the caller's bytes (not a
// 500 on PostgreSQL, which refuses such text). In a JSON body, a NUL is
// refused at decode, before anything is looked up, whether the resource
// exists or not.
func TestImpossibleIDsAnswerAsMissing(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		_, adminA := e.TenantAdmin(t, "tenant-a")
		k := clientKey(t, adminA)
		upgrade := func(rid string) map[string]string {
			return map[string]string{"Content-Type": "", "Upgrade": "bc-tunnel-v1", "Connection": "Upgrade", "Bc-Ticket": "x", "X-Request-Id": rid}
		}
		for rid, path := range map[string]string{
			"missing-node":    "?node=nmissing&port=22",
			"node-not-utf8":   "?node=n%FF&port=22",
			"node-nul":        "?node=n%00&port=22",
			"sandbox-nul":     "?sandbox=s%00",
			"sandbox-missing": "?sandbox=smissing",
		} {
			r := do(t, e, "GET", api.TunnelConnectPath+path, k, upgrade(rid), "")
			if r.status != 403 || r.code() != "ACCESS_DENIED" {
				t.Errorf("%s: %d %s (%s), want 403 ACCESS_DENIED as for a missing id", rid, r.status, r.code(), r.body)
			}
			var res, details string
			err := db.QueryRowContext(context.Background(), `SELECT resource, details FROM audit_events WHERE request_id = $1 AND outcome = 'denied'`, rid).Scan(&res, &details)
			if err != nil || details != `{"reason":"`+api.ReasonOutOfReach+`"}` || strings.IndexByte(res, 0) >= 0 || !utf8.ValidString(res) || (!strings.Contains(rid, "missing") && !strings.HasSuffix(res, "/(malformed)")) {
				t.Errorf("%s: denial row %q %q (%v), want one out-of-reach row naming (malformed)", rid, res, details, err)
			}
		}
		expectCode(t, do(t, e, "POST", "/api/v1/nodes.get", k, nil, `{"id":"n\u0000"}`), 400, "INVALID_INPUT")
	})
}
