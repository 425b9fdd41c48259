package api_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// Noisy-neighbour load: how many calls of each kind the noisy tenant keeps
// running at once, the size of each, and how many reads the quiet tenant
// makes in each phase.
const (
	noisyCreateMany = 4    // parallel joinTokens.createMany loops at the cap
	noisyFanouts    = 1    // parallel commands.fanout loops
	noisyFanoutSize = 1000 // nodes per fan-out
	quietSamples    = 200  // nodes.list calls per phase
	// samplePace spaces the quiet calls, so a phase lasts about 20 s and
	// the noisy calls are under way for all of it.
	samplePace = 100 * time.Millisecond
	// noisyTokenQuota lets the noisy tenant hold twenty createMany calls'
	// worth of tokens (the load outside testers reported); past it its
	// calls are refused RESOURCE_EXHAUSTED, as in production.
	noisyTokenQuota = 20 * 10000
	// phaseLimit bounds the sampling under load, so a run stops by itself.
	phaseLimit = 90 * time.Second
)

// BenchmarkNoisyNeighbour measures a quiet tenant's nodes.list latency
// (p50 and p99 over quietSamples serial calls) alone, and again while a
// noisy tenant keeps noisyCreateMany joinTokens.createMany calls of 10,000
// (the cap) and noisyFanouts commands.fanout calls running, with the
// shipped per-tenant bounds (4 mutating calls at once; quotas raised for
// the noisy tenant's join tokens to noisyTokenQuota so its calls really
// write) and the rate limits lifted.
// Run it once (-benchtime 1x); bench/api/run noisy prints the ratios.
func BenchmarkNoisyNeighbour(b *testing.B) {
	for _, dialect := range []string{"sqlite", "postgres"} {
		b.Run(dialect, func(b *testing.B) {
			var db *store.DB
			if dialect == "sqlite" {
				db = storetest.NewTestSQLite(b)
			} else {
				db = storetest.NewTestPostgres(b)
			}
			e := testenv.Start(b, db, testenv.Options{Tune: func(o *server.Options) {
				o.RateLimits = api.RateLimits{ReadPerSecond: 1e9, ReadBurst: 1e9, MutatePerSecond: 1e9, MutateBurst: 1e9}
				o.TenantMutates = api.DefaultTenantMutates
			}})
			ctx := context.Background()
			quietT, quiet := e.TenantAdmin(b, "quiet")
			noisyT, noisy := e.TenantAdmin(b, "noisy")
			noisy.Retry = client.Retry{MaxTries: 1} // count each refusal, never wait it out
			if _, err := e.Client.SetQuotas(ctx, noisyT, client.QuotaOverrides{JoinTokens: client.Limit(noisyTokenQuota)}, false); err != nil {
				b.Fatal(err)
			}
			insertNodes(b, db, quietT, "q", 10)
			fanoutIDs := insertNodes(b, db, noisyT, "z", noisyFanoutSize)
			for range 20 { // warm the connection and statement caches
				if _, err := quiet.Nodes(ctx); err != nil {
					b.Fatal(err)
				}
			}
			alone := sampleLatencies(b, quiet)

			nctx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			var done, limited, exhausted atomic.Int64
			started := make(chan struct{}, noisyCreateMany+noisyFanouts)
			loop := func(call func() error) {
				defer wg.Done()
				first := true
				for nctx.Err() == nil {
					if first {
						started <- struct{}{}
						first = false
					}
					err := call()
					switch {
					case err == nil:
						done.Add(1)
					case errors.Is(err, client.ErrRateLimited):
						limited.Add(1)
					case errors.Is(err, client.ErrResourceExhausted):
						exhausted.Add(1)
					case nctx.Err() != nil:
					default:
						b.Errorf("noisy call: %v", err)
						return
					}
				}
			}
			for range noisyCreateMany {
				wg.Add(1)
				go loop(func() error {
					return noisy.Call(nctx, "joinTokens.createMany", map[string]any{"role": "node-tenant", "count": 10000}, nil)
				})
			}
			for range noisyFanouts {
				wg.Add(1)
				go loop(func() error {
					return noisy.Call(nctx, "commands.fanout", map[string]any{"node_ids": fanoutIDs, "kind": "diag.run"}, nil)
				})
			}
			for range noisyCreateMany + noisyFanouts {
				<-started
			}
			under := sampleLatencies(b, quiet)
			stop()
			wg.Wait()

			p := func(xs []time.Duration, q float64) float64 {
				return float64(xs[min(len(xs)-1, int(q*float64(len(xs))))].Microseconds()) / 1000
			}
			b.ReportMetric(p(alone, 0.5), "alone-p50-ms")
			b.ReportMetric(p(alone, 0.99), "alone-p99-ms")
			b.ReportMetric(p(under, 0.5), "noisy-p50-ms")
			b.ReportMetric(p(under, 0.99), "noisy-p99-ms")
			b.ReportMetric(float64(slices.Max(under).Microseconds())/1000, "noisy-max-ms")
			b.ReportMetric(float64(done.Load()), "noisy-calls")
			b.ReportMetric(float64(limited.Load()), "noisy-rate-limited")
			b.ReportMetric(float64(exhausted.Load()), "noisy-exhausted")
			b.ReportMetric(float64(len(under)), "noisy-samples")
		})
	}
}

// sampleLatencies times quietSamples serial nodes.list calls, one every
// samplePace, sorted.
func sampleLatencies(b *testing.B, c *client.Client) []time.Duration {
	out := make([]time.Duration, 0, quietSamples)
	end := time.Now().Add(phaseLimit)
	for range quietSamples {
		if time.Now().After(end) {
			b.Logf("stopped after %d samples (%s)", len(out), phaseLimit)
			break
		}
		t0 := time.Now()
		if _, err := c.Nodes(context.Background()); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		out = append(out, d)
		time.Sleep(samplePace - min(d, samplePace)) // pacing the load, not synchronising
	}
	slices.Sort(out)
	return out
}

// insertNodes adds n disconnected node rows to tenant (commands to them
// stay queued) and returns their ids.
func insertNodes(b *testing.B, db *store.DB, tenant, prefix string, n int) []string {
	ids := make([]string, 0, n)
	for chunk := range slices.Chunk(make([]int, n), 500) {
		var q strings.Builder
		q.WriteString(`INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES `)
		a := db.NewArgs()
		for i := range chunk {
			if i > 0 {
				q.WriteString(", ")
			}
			id := fmt.Sprintf("n%s%07d", prefix, len(ids))
			ids = append(ids, id)
			q.WriteString("(" + a.List(id, tenant, id, "node-tenant", 0) + ")")
		}
		if _, err := db.ExecContext(context.Background(), q.String(), a.Values()...); err != nil {
			b.Fatal(err)
		}
	}
	return ids
}
