package api_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// baselineServer answers every request with a fixed JSON body: the same
// loopback HTTP/1.1 transport with nothing of the envelope.
func baselineServer(b *testing.B) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"id":"n","name":"x","connected":true}` + "\n")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})}
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(func() { srv.Close() })
	return "http://" + lis.Addr().String() + "/api/v1/nodes.get"
}

func post(b *testing.B, c *http.Client, url, key, body string) {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
}

// BenchmarkEnvelopeRead measures an authenticated, authorized read
// (nodes.get for a node of the caller's tenant, by a tenant admin) through
// the whole envelope ("envelope"), and the bare loopback HTTP transport
// answering a fixed body in the same process ("bare"), each serially and
// with 16 concurrent clients. bench/api/run prints the ratios.
func BenchmarkEnvelopeRead(b *testing.B) {
	for _, dialect := range []string{"sqlite", "postgres"} {
		b.Run(dialect, func(b *testing.B) {
			var db *store.DB
			if dialect == "sqlite" {
				db = storetest.NewTestSQLite(b)
			} else {
				db = storetest.NewTestPostgres(b)
			}
			// Rate limits would refuse a benchmark's load; lift them for it.
			e := testenv.Start(b, db, testenv.Options{Tune: func(o *server.Options) {
				o.RateLimits = api.RateLimits{ReadPerSecond: 1e9, ReadBurst: 1e9, MutatePerSecond: 1e9, MutateBurst: 1e9}
			}})
			tenant, admin := e.TenantAdmin(b, "bench")
			if _, err := db.ExecContext(context.Background(), `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ('nbenchbenchbench', $1, 'b', 'node', 0)`, tenant); err != nil {
				b.Fatal(err)
			}
			key := admin.Key()
			urls := map[string]string{"envelope": "http://" + e.CP.APIAddr + "/api/v1/nodes.get", "bare": baselineServer(b)}
			body := `{"id":"nbenchbenchbench"}`
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			for _, name := range []string{"bare", "envelope"} {
				url := urls[name]
				b.Run(name, func(b *testing.B) {
					for i := 0; i < b.N; i++ {
						post(b, hc, url, key, body)
					}
				})
				b.Run(name+"-concurrent", func(b *testing.B) {
					b.SetParallelism(8) // 8 x GOMAXPROCS clients
					start := time.Now()
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							post(b, hc, url, key, body)
						}
					})
					b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
				})
			}
		})
	}
}
