package integration

import (
	"context"
	"fmt"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// BenchmarkFanoutQueueAndSign measures the control plane's half of a
// 10,000-node fan-out before any node is involved: the commands.fanout
// call by label (resolve, queue, audit) and signing every command, on
// each database. bench/fleet measures the whole path with nodes.
func BenchmarkFanoutQueueAndSign(b *testing.B) {
	for name, open := range map[string]func(testing.TB) *store.DB{"sqlite": storetest.NewTestSQLite, "postgres": storetest.NewTestPostgres} {
		b.Run(name, func(b *testing.B) { benchFanoutQueueAndSign(b, open(b)) })
	}
}

func benchFanoutQueueAndSign(b *testing.B, db *store.DB) {
	{
		e := testenv.Start(b, db, testenv.Options{})
		ctx := context.Background()
		const n = 10000
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("n-bench-%05d", i)
			if _, err := db.ExecContext(ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at, labels) VALUES ($1, 'root', $1, 'node', 0, '{"fleet":"bench"}')`, id); err != nil {
				b.Fatal(err)
			}
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			var out struct {
				Count int `json:"count"`
			}
			if err := e.Client.Call(ctx, "commands.fanout", map[string]any{"labels": map[string]string{"fleet": "bench"}, "kind": "diag.run"}, &out); err != nil || out.Count != n {
				b.Fatalf("fanout: %d, %v", out.Count, err)
			}
			if _, err := e.CP.Signer.SignPending(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
}
