package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// A fan-out's commands share its id: commands.get and commands.list show
// it, commands.list fanout_id keeps one fan-out's commands (not another
// fan-out's, not a lone command), commands.fanoutSummary counts them by
// state (NOT_FOUND for an id the caller sees no command of), and
// commands.list refuses a state that is none of the six.
func TestFanoutIDGroupsItsCommands(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 3})
		ctx := context.Background()
		ids := []string{e.Nodes[0].NodeID(), e.Nodes[1].NodeID(), e.Nodes[2].NodeID()}
		first, err := e.Client.Fanout(ctx, client.FanoutIn{NodeIDs: ids, Kind: "diag.run"})
		if err != nil || first.FanoutID == "" || first.Count != 3 {
			t.Fatalf("fan-out: %+v %v", first, err)
		}
		second, err := e.Client.Fanout(ctx, client.FanoutIn{NodeIDs: ids[:2], Kind: "node.ping"})
		if err != nil || second.FanoutID == "" || second.FanoutID == first.FanoutID {
			t.Fatalf("second fan-out: %+v %v (first %s)", second, err, first.FanoutID)
		}
		lone, err := e.Client.CreateCommand(ctx, ids[0], "node.ping", nil)
		if err != nil || lone.FanoutID != "" {
			t.Fatalf("lone command: %+v %v", lone, err)
		}
		for _, id := range append(append([]string{}, first.CommandIDs...), second.CommandIDs...) {
			e.WaitCommand(t, id)
		}
		if c, err := e.Client.Command(ctx, first.CommandIDs[1]); err != nil || c.FanoutID != first.FanoutID {
			t.Fatalf("commands.get: fanout_id %q (%v), want %s", c.FanoutID, err, first.FanoutID)
		}
		got, err := e.Client.Commands(ctx, client.CommandListIn{FanoutID: first.FanoutID})
		if err != nil || len(got) != 3 {
			t.Fatalf("commands.list fanout_id: %d commands (%v), want 3", len(got), err)
		}
		for _, c := range got {
			if c.FanoutID != first.FanoutID || c.Kind != "diag.run" {
				t.Fatalf("commands.list fanout_id answered %+v", c)
			}
		}
		sum, err := e.Client.FanoutSummary(ctx, first.FanoutID)
		if err != nil || sum.Total != 3 || sum.States["succeeded"] != 3 || !sum.Done() {
			t.Fatalf("summary: %+v %v", sum, err)
		}
		if _, err := e.Client.FanoutSummary(ctx, "fonosuchfanout"); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("summary of an unknown fan-out: %v, want NOT_FOUND", err)
		}
		// Another tenant sees none of root's fan-out.
		_, other := e.TenantAdmin(t, "fan-other")
		if got, err := other.Commands(ctx, client.CommandListIn{FanoutID: first.FanoutID}); err != nil || len(got) != 0 {
			t.Fatalf("another tenant lists %d of root's fan-out (%v)", len(got), err)
		}
		if _, err := other.FanoutSummary(ctx, first.FanoutID); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("another tenant's summary of root's fan-out: %v, want NOT_FOUND", err)
		}
		for _, bogus := range []string{"bogus", "Succeeded", "succeeded "} {
			if _, err := e.Client.Commands(ctx, client.CommandListIn{State: bogus}); client.CodeOf(err) != "INVALID_INPUT" {
				t.Fatalf("commands.list state %q: %v, want INVALID_INPUT", bogus, err)
			}
		}
		if got, err := e.Client.Commands(ctx, client.CommandListIn{State: "succeeded", FanoutID: second.FanoutID}); err != nil || len(got) != 2 {
			t.Fatalf("commands.list succeeded of the second fan-out: %d (%v), want 2", len(got), err)
		}
	})
}
