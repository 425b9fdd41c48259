package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

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
		var queue, sign time.Duration
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			var out struct {
				Count int `json:"count"`
			}
			if err := e.Client.Call(ctx, "commands.fanout", map[string]any{"labels": map[string]string{"fleet": "bench"}, "kind": "diag.run"}, &out); err != nil || out.Count != n {
				b.Fatalf("fanout: %d, %v", out.Count, err)
			}
			t1 := time.Now()
			if _, err := e.CP.Signer.SignPending(ctx); err != nil {
				b.Fatal(err)
			}
			queue, sign = queue+t1.Sub(t0), sign+time.Since(t1)
		}
		b.ReportMetric(queue.Seconds()/float64(b.N), "queue-s/op")
		b.ReportMetric(sign.Seconds()/float64(b.N), "sign-s/op")
	}
}
