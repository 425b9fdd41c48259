package previews_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previews"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// TestPreviewIssueBounds: sandboxes.preview issues a URL for a running
// sandbox the scope sees, for an hour by default and never past the
// sandbox's deadline; a port outside 1 to 65535 or a ttl outside a minute
// to a day is INVALID_INPUT, another tenant's sandbox NOT_FOUND, one not
// running INVALID_STATE, and without a preview role UNAVAILABLE. The
// audit row never holds the token.
func TestPreviewIssueBounds(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		sbx := fakeSandboxes{
			"sb-one":  {ID: "sb-one", TenantID: "t-acme", NodeID: "n-1", State: sandboxes.StateRunning, ExpiresAt: clk.Now().Add(30 * time.Minute)},
			"sb-gone": {ID: "sb-gone", TenantID: "t-acme", NodeID: "n-1", State: sandboxes.StateDeleted, ExpiresAt: clk.Now().Add(time.Hour)},
		}
		base := "https://preview.example"
		svc := previews.New(db, previews.NewKeys(db, newKEK(t), clk), sbx, clk, func() string { return base })
		acme := iam.ScopeOf("t-acme")
		p, err := svc.Issue(ctx, audit.Entry{Actor: "alice", RequestID: "req-preview"}, acme, "sb-one", 8080, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(p.URL, base+"/p/sb-one/8080/v1.") || !p.ExpiresAt.Equal(clk.Now().Add(30*time.Minute)) || p.Port != 8080 || p.SandboxID != "sb-one" {
			t.Fatalf("issued %+v (want clamped to the sandbox's deadline)", p)
		}
		var details string
		if err := db.QueryRowContext(ctx, `SELECT details FROM audit_events WHERE request_id = 'req-preview'`).Scan(&details); err != nil {
			t.Fatal(err)
		}
		tok := strings.Split(strings.TrimSuffix(p.URL, "/"), "/")[6]
		if strings.Contains(details, tok) || strings.Contains(details, tok[strings.LastIndex(tok, ".")+1:]) {
			t.Fatalf("the audit row holds the token: %s", details)
		}
		for _, c := range []struct {
			name  string
			scope iam.Scope
			id    string
			port  int
			ttl   time.Duration
			want  errs.Code
		}{
			{"port 0", acme, "sb-one", 0, 0, errs.InvalidInput},
			{"port 65536", acme, "sb-one", 65536, 0, errs.InvalidInput},
			{"ttl over a day", acme, "sb-one", 8080, 25 * time.Hour, errs.InvalidInput},
			{"ttl under a minute", acme, "sb-one", 8080, time.Second, errs.InvalidInput},
			{"another tenant's sandbox", iam.ScopeOf("t-other"), "sb-one", 8080, 0, errs.NotFound},
			{"a missing sandbox", acme, "sb-none", 8080, 0, errs.NotFound},
			{"a deleted sandbox", acme, "sb-gone", 8080, 0, errs.InvalidState},
		} {
			if _, err := svc.Issue(ctx, audit.Entry{Actor: "alice"}, c.scope, c.id, c.port, c.ttl); errs.CodeOf(err) != c.want {
				t.Errorf("%s: %v, want %s", c.name, err, c.want)
			}
		}
		base = ""
		if _, err := svc.Issue(ctx, audit.Entry{Actor: "alice"}, acme, "sb-one", 8080, 0); errs.CodeOf(err) != errs.Unavailable {
			t.Fatalf("no preview role: %v", err)
		}
	})
}
