package integration

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

func TestCommandRunsAttested(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 2})
		ctx := context.Background()
		nodes, err := e.Client.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) != 2 || !nodes[0].Connected || !nodes[1].Connected {
			t.Fatalf("nodes = %+v, want 2 connected", nodes)
		}
		c, err := e.Client.CreateCommand(ctx, e.Nodes[0].NodeID(), "diag.run", nil)
		if err != nil {
			t.Fatal(err)
		}
		got := e.WaitCommand(t, c.ID)
		if got.State != "succeeded" || !got.Attested {
			t.Fatalf("command = %s attested=%v reason=%q, want succeeded and attested", got.State, got.Attested, got.Reason)
		}
		var res struct{ Healthy bool }
		if err := json.Unmarshal(got.Result, &res); err != nil || !res.Healthy {
			t.Fatalf("result = %s (%v)", got.Result, err)
		}
		if e.Nodes[0].Sim.Runs("diag.run") != 1 || e.Nodes[1].Sim.Runs("diag.run") != 0 {
			t.Fatalf("diag.run ran %d/%d times, want 1/0", e.Nodes[0].Sim.Runs("diag.run"), e.Nodes[1].Sim.Runs("diag.run"))
		}
	})
}
