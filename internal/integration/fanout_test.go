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

// One API call creates a signed command for many nodes; each node verifies
// and runs its own, and every result is attested.
func TestFanoutToManyNodes(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 3})
		ctx := context.Background()
		var out struct {
			Count      int      `json:"count"`
			CommandIDs []string `json:"command_ids"`
		}
		ids := []string{e.Nodes[0].NodeID(), e.Nodes[1].NodeID(), e.Nodes[2].NodeID()}
		if err := e.Client.Call(ctx, "commands.fanout", map[string]any{"node_ids": ids, "kind": "diag.run"}, &out); err != nil {
			t.Fatal(err)
		}
		if out.Count != 3 {
			t.Fatalf("fan-out made %d commands", out.Count)
		}
		for _, id := range out.CommandIDs {
			if c := e.WaitCommand(t, id); c.State != "succeeded" || !c.Attested {
				t.Fatalf("%s: %s attested=%v", id, c.State, c.Attested)
			}
		}
		for _, n := range e.Nodes {
			if n.Sim.Runs("diag.run") != 1 {
				t.Fatalf("node %s ran diag.run %d times", n.NodeID(), n.Sim.Runs("diag.run"))
			}
		}
		// Another tenant cannot address root's nodes in a fan-out.
		_, other := e.TenantAdmin(t, "fan")
		err := other.Call(ctx, "commands.fanout", map[string]any{"node_ids": ids[:1], "kind": "node.ping"}, nil)
		if !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("cross-tenant fan-out: %v, want ACCESS_DENIED", err)
		}
	})
}
