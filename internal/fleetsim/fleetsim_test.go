package fleetsim_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/fleetsim"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// A simulated fleet joins with real tokens, holds real sessions, and every
// node runs (and attests) its own command of a fan-out.
func TestFleetJoinsAndRunsFanout(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	ctx := context.Background()
	const n = 20
	toks, err := e.CP.Nodes.CreateJoinTokens(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "test"}, "node", n, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var tokens []string
	for _, tk := range toks {
		tokens = append(tokens, tk.Token)
	}
	dir := t.TempDir()
	f, rep, err := fleetsim.Start(ctx, fleetsim.Options{Nodes: n, Gateway: e.CP.GatewayAddr, Tokens: tokens, DataDir: dir, Parallel: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	if rep.Joined != n || rep.JoinsPerSecond <= 0 {
		t.Fatalf("report %+v", rep)
	}
	wctx, cancel := context.WithTimeout(ctx, testenv.WaitTimeout)
	defer cancel()
	if err := f.WaitConnected(wctx, n); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, node := range f.Nodes {
		ids = append(ids, node.NodeID())
	}
	cmds, err := e.CP.Commands.CreateMany(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "test"}, ids, "diag.run", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		if got := e.WaitCommand(t, c.ID); got.State != "succeeded" || !got.Attested {
			t.Fatalf("%s: %s attested=%v", c.ID, got.State, got.Attested)
		}
	}
	// Every node verified its command's worker chain through the one
	// shared memo: one worker key, one entry.
	if got := f.WorkerChains.Len(); got != 1 {
		t.Fatalf("shared worker-chain memo holds %d entries, want 1", got)
	}
	rate, err := f.RenewAll(wctx, 8)
	if err != nil || rate <= 0 {
		t.Fatalf("renew all: %v %v", rate, err)
	}
	// A used token file is refused if others can read it.
	p := filepath.Join(dir, "tokens")
	if err := os.WriteFile(p, []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := fleetsim.ReadTokens(p); err == nil {
		t.Fatal("a world-readable tokens file was accepted")
	}
}

// The join pool tries every node even when one join fails, and reports the
// first failure with the joins that succeeded.
func TestFleetJoinPoolReportsAFailedJoin(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	ctx := context.Background()
	toks, err := e.CP.Nodes.CreateJoinTokens(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "test"}, "node", 3, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tokens := []string{toks[0].Token, "not-a-token", toks[2].Token}
	f, rep, err := fleetsim.Start(ctx, fleetsim.Options{Nodes: 3, Gateway: e.CP.GatewayAddr, Tokens: tokens, DataDir: t.TempDir(), Parallel: 2})
	if err == nil {
		f.Stop()
		t.Fatal("a fleet with a bad token started")
	}
	if !strings.Contains(err.Error(), "join node 1") || rep.Joined != 2 {
		t.Fatalf("err %v, report %+v; want node 1's failure and 2 joined", err, rep)
	}
}
