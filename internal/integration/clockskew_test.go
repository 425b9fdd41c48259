package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestNodeClockTenMinutesOff runs a real bcd whose clock is 10 minutes
// off the control plane's (clock.Offset, a real clock read 10 minutes
// early or late), through the real gateway and the workers' signed time
// statements (every 10 s, relayed in Welcome).
//
// Slow by 10 minutes: the signed statement is more than the 5-minute skew
// ahead of the node's clock but within daemon.MaxClockCorrection, so it
// sets the node's time for this process and is not saved (state.json
// keeps no highest time). A command created now runs (the node's own
// clock would refuse it not-yet-valid), and a command signed to expire a
// minute ago, which the node's own clock still finds valid, is refused
// expired: signed time, not the slow clock, decides.
//
// Fast by 10 minutes: a statement is only a lower bound on the time, so
// the node keeps its own clock. A command with an hour to live runs; one
// with the default 10 minutes (or 5) has expired by the node's clock and
// is refused node-clock-ahead, since by the signed time it has not. It
// never runs.
func TestNodeClockTenMinutesOff(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		e := testenv.Start(t, db, testenv.Options{})
		open := func(t *testing.T, off time.Duration) *testenv.Node {
			t.Helper()
			// A fresh statement for the Welcome: the workers' first one may
			// not be stored yet when a test's node connects.
			if _, err := e.CP.Signer.SignTime(ctx); err != nil {
				t.Fatal(err)
			}
			j := e.Join(t, pki.RoleNode, "")
			n := e.OpenNodeWith(t, j.Dir, "", func(c *daemon.Config) { c.Clock = clock.Offset{By: off} })
			n.Start(t)
			n.WaitConnected(t)
			return n
		}

		t.Run("slow", func(t *testing.T) {
			n := open(t, -10*time.Minute)
			c, err := e.Client.CreateCommand(ctx, n.NodeID(), "diag.run", nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := e.WaitCommand(t, c.ID); got.State != "succeeded" {
				t.Fatalf("a command created now: %s %q, want succeeded", got.State, got.Reason)
			}
			body := e.Body(n.NodeID(), "diag.run")
			body.IssuedAtMs = time.Now().Add(-30 * time.Minute).UnixMilli()
			body.ExpiresAtMs = time.Now().Add(-time.Minute).UnixMilli()
			rk, err := e.Bundle.CommandRootKey(e.KEK)
			if err != nil {
				t.Fatal(err)
			}
			// A worker key that was valid when the body was issued.
			old := testenv.SignerFromRoot(t, e.Bundle.CommandRoot, rk, e.Bundle.TrustDomain, time.Now().Add(-time.Hour))
			id := e.InjectCommand(t, n.NodeID(), body, old)
			if got := e.WaitCommand(t, id); got.State != "cancelled" || got.Reason != daemon.ReasonExpired {
				t.Fatalf("a command expired a minute ago: %s %q, want cancelled %q", got.State, got.Reason, daemon.ReasonExpired)
			}
			if runs := n.Sim.Runs("diag.run"); runs != 1 {
				t.Fatalf("diag.run ran %d times, want 1 (not the expired one)", runs)
			}
			raw, err := os.ReadFile(filepath.Join(n.Dir, "state.json"))
			if err == nil {
				var st struct {
					Highest int64 `json:"highest_server_time_ms"`
				}
				if err := json.Unmarshal(raw, &st); err != nil || st.Highest != 0 {
					t.Fatalf("state.json %s (%v): the statement 10 minutes ahead was saved", raw, err)
				}
			} else if !os.IsNotExist(err) {
				t.Fatal(err)
			}
		})

		t.Run("fast", func(t *testing.T) {
			n := open(t, 10*time.Minute)
			hour, err := e.CP.Commands.Create(ctx, admin, n.NodeID(), "diag.run", nil, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if got := e.WaitCommand(t, hour.ID); got.State != "succeeded" {
				t.Fatalf("a command with an hour to live: %s %q, want succeeded", got.State, got.Reason)
			}
			def, err := e.Client.CreateCommand(ctx, n.NodeID(), "node.ping", nil) // the default TTL, 10 minutes
			if err != nil {
				t.Fatal(err)
			}
			expectCancelled(t, e, n, def.ID, "node.ping", daemon.ReasonClockAhead)
			five, err := e.CP.Commands.Create(ctx, admin, n.NodeID(), "node.ping", nil, 5*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			expectCancelled(t, e, n, five.ID, "node.ping", daemon.ReasonClockAhead)
		})
	})
}
