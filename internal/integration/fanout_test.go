package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/iam"
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

// A fan-out wider than one statement's chunk (500) writes one command and
// one audit row per node; the gateway's batch reads (PendingFor) and
// writes (MarkSent) cover every chunk too.
func TestFanoutAcrossChunks(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		const n = 1201
		var nodeIDs []string
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("n-chunk-%04d", i)
			if _, err := db.ExecContext(ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ($1, 'root', $1, 'node', 0)`, id); err != nil {
				t.Fatal(err)
			}
			nodeIDs = append(nodeIDs, id)
		}
		cmds, err := e.CP.Commands.CreateMany(ctx, audit.Entry{TenantID: "root", Actor: "test"}, append(nodeIDs, nodeIDs[7]), "diag.run", nil, 0)
		if err != nil || len(cmds) != n {
			t.Fatalf("CreateMany: %d commands, %v", len(cmds), err)
		}
		var audited int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events a JOIN commands c ON a.resource = 'command/' || c.id
			WHERE a.action = 'compute:commands:create' AND a.tenant_id = 'root'`).Scan(&audited); err != nil || audited != n {
			t.Fatalf("%d audit rows for %d commands (%v)", audited, n, err)
		}
		// The workers' own signer runs too: sign until nothing is left
		// unsigned, whoever signed it.
		for unsigned := -1; unsigned != 0; {
			if _, err := e.CP.Signer.SignPending(ctx); err != nil {
				t.Fatal(err)
			}
			if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM commands WHERE body IS NULL`).Scan(&unsigned); err != nil {
				t.Fatal(err)
			}
		}
		pending, err := e.CP.Commands.PendingFor(ctx, nodeIDs, 1)
		if err != nil || len(pending) != n {
			t.Fatalf("PendingFor: %d nodes, %v", len(pending), err)
		}
		var marks []wire.Sent
		for _, c := range cmds {
			got := pending[c.NodeID]
			if len(got) != 1 || got[0].Id != c.ID || len(got[0].Signature) == 0 {
				t.Fatalf("node %s: pending %v, want its one signed command %s", c.NodeID, got, c.ID)
			}
			marks = append(marks, wire.Sent{CommandID: c.ID, SessionID: "s-" + c.NodeID})
		}
		if err := e.CP.Commands.MarkSent(ctx, marks); err != nil {
			t.Fatal(err)
		}
		var sent int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM commands WHERE state = 'sent'`).Scan(&sent); err != nil || sent != n {
			t.Fatalf("%d commands sent, want %d (%v)", sent, n, err)
		}
		if pending, err := e.CP.Commands.PendingFor(ctx, nodeIDs, 1); err != nil || len(pending) != 0 {
			t.Fatalf("after MarkSent %d nodes still pending (%v)", len(pending), err)
		}
	})
}

// More commands for one node than the gateway hands a session at once
// (64) each reach the node exactly once, in order: none is refused as a
// replay, none is left behind.
func TestManyCommandsToOneNodeRunOnce(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		node := e.Nodes[0].NodeID()
		ids := make([]string, 150)
		for i := range ids {
			c, err := e.CP.Commands.Create(ctx, audit.Entry{TenantID: "root", Actor: "test"}, node, "diag.run", nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ids[i] = c.ID
		}
		for _, id := range ids {
			if c := e.WaitCommand(t, id); c.State != "succeeded" || !c.Attested {
				t.Fatalf("%s: %s (%s) attested=%v", id, c.State, c.Reason, c.Attested)
			}
		}
		if runs := e.Nodes[0].Sim.Runs("diag.run"); runs != len(ids) {
			t.Fatalf("the node ran diag.run %d times for %d commands", runs, len(ids))
		}
		if r := e.Nodes[0].Refusals(); len(r) != 0 {
			t.Fatalf("the node refused commands: %v (a command delivered twice is refused %q)", r, "replayed")
		}
	})
}

// A queued command is cancelled `expired` at its expiry; a sent one, which
// its node may have accepted just before and still be running, only
// commands.SentGrace later.
func TestSweepExpiredGivesSentCommandsGrace(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		clk := clock.NewFake(time.Now())
		e := testenv.Start(t, db, testenv.Options{Clock: clk})
		ctx := context.Background()
		if _, err := db.ExecContext(ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ('n-sweep', 'root', 'n-sweep', 'node', 0)`); err != nil {
			t.Fatal(err)
		}
		actor := audit.Entry{TenantID: "root", Actor: "test"}
		queued, err := e.CP.Commands.Create(ctx, actor, "n-sweep", "diag.run", nil, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		sent, err := e.CP.Commands.Create(ctx, actor, "n-sweep", "diag.run", nil, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.CP.Commands.MarkSent(ctx, []wire.Sent{{CommandID: sent.ID, SessionID: "s-sweep"}}); err != nil {
			t.Fatal(err)
		}
		state := func(id string) string {
			c, err := e.CP.Commands.Get(ctx, iam.RootScope(), id)
			if err != nil {
				t.Fatal(err)
			}
			return string(c.State) + "/" + c.Reason
		}
		clk.Advance(time.Minute + time.Second)
		if _, err := e.CP.Commands.SweepExpired(ctx); err != nil {
			t.Fatal(err)
		}
		if got := state(queued.ID); got != "cancelled/expired" {
			t.Fatalf("queued command past expiry: %s, want cancelled/expired", got)
		}
		if got := state(sent.ID); got != "sent/" {
			t.Fatalf("sent command within the grace: %s, want sent", got)
		}
		clk.Advance(commands.SentGrace)
		if _, err := e.CP.Commands.SweepExpired(ctx); err != nil {
			t.Fatal(err)
		}
		if got := state(sent.ID); got != "cancelled/expired" {
			t.Fatalf("sent command past the grace: %s, want cancelled/expired", got)
		}
	})
}
