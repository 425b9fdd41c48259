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
		var list struct {
			Commands []client.Command `json:"commands"`
		}
		if err := e.Client.Call(ctx, "commands.list", map[string]any{"node_id": ids[1]}, &list); err != nil || len(list.Commands) != 1 || list.Commands[0].NodeID != ids[1] {
			t.Fatalf("commands.list for one node: %+v %v", list.Commands, err)
		}
		// Another tenant sees none of root's commands, and cannot address
		// root's nodes in a fan-out.
		_, other := e.TenantAdmin(t, "fan")
		if err := other.Call(ctx, "commands.list", nil, &list); err != nil || len(list.Commands) != 0 {
			t.Fatalf("another tenant lists %d commands (%v)", len(list.Commands), err)
		}
		err := other.Call(ctx, "commands.fanout", map[string]any{"node_ids": ids[:1], "kind": "node.ping"}, nil)
		if !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("cross-tenant fan-out: %v, want ACCESS_DENIED", err)
		}
	})
}
