package daemon_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/jointoken"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// A token whose pin names another join key must not be sent: the gateway
// is not the one the token was made for.
func TestJoinRefusesGatewayWithWrongPin(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	ctx := context.Background()
	tok, err := e.CP.Nodes.CreateJoinToken(ctx, audit.Entry{TenantID: "root", Actor: "test"}, "node", "x", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := jointoken.Parse(tok.Token)
	if err != nil {
		t.Fatal(err)
	}
	parsed.Pin[0] ^= 1
	_, err = daemon.Join(ctx, daemon.JoinOptions{DataDir: filepath.Join(t.TempDir(), "n"), Gateway: e.CP.GatewayAddr, Token: parsed.String(), Name: "x"})
	if err == nil || !strings.Contains(err.Error(), "does not match the token's pin") {
		t.Fatalf("got %v, want a pin mismatch", err)
	}
	var used int
	if err := e.CP.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM join_tokens WHERE used_at IS NOT NULL`).Scan(&used); err != nil || used != 0 {
		t.Fatalf("token spent (%d, %v): it was sent to an unverified gateway", used, err)
	}
	evs, err := e.CP.Events.List(ctx, "security.join.refused")
	if err != nil || len(evs) != 0 {
		t.Fatalf("the gateway saw a join attempt: %v %v", evs, err)
	}
}
