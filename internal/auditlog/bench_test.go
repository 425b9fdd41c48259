package auditlog_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// benchRows is the tenant size of BenchmarkAuditLog: BC_AUDIT_BENCH_ROWS
// (bench/audit/run sets 1,000,000), 20,000 by default so that -bench .
// stays short.
func benchRows() int {
	if n, err := strconv.Atoi(os.Getenv("BC_AUDIT_BENCH_ROWS")); err == nil && n > 0 {
		return n
	}
	return 20_000
}

// bulkInsert writes n rows for tenant with multi-row INSERTs in one
// transaction: the fast way to make a big tenant, not the API's path.
func bulkInsert(b *testing.B, db *store.DB, tenant string, n int) {
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	if db.Dialect == store.SQLite {
		st, err := tx.PrepareContext(ctx, `INSERT INTO audit_events (id, tenant_id, at, actor, action, resource, outcome, request_id, caller, details) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)`)
		if err != nil {
			b.Fatal(err)
		}
		for k := 0; k < n; k++ {
			if _, err := st.ExecContext(ctx, benchRow(tenant, k)...); err != nil {
				b.Fatal(err)
			}
		}
		st.Close()
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
		return
	}
	const per = 500
	for start := 0; start < n; start += per {
		cnt := min(per, n-start)
		var sb strings.Builder
		sb.WriteString(`INSERT INTO audit_events (id, tenant_id, at, actor, action, resource, outcome, request_id, caller, details) VALUES `)
		args := make([]any, 0, cnt*10)
		for i := 0; i < cnt; i++ {
			k := start + i
			if i > 0 {
				sb.WriteByte(',')
			}
			p := i * 10
			fmt.Fprintf(&sb, "($%d,$%d,$%d,$%d,$%d,$%d,$%d,$%d,$%d,$%d)", p+1, p+2, p+3, p+4, p+5, p+6, p+7, p+8, p+9, p+10)
			args = append(args, benchRow(tenant, k)...)
		}
		if _, err := tx.ExecContext(ctx, sb.String(), args...); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}

func benchRow(tenant string, k int) []any {
	return []any{fmt.Sprintf("ev_%016d", k), tenant, int64(1_700_000_000_000 + k), "user:alice", "commands.create",
		fmt.Sprintf("command/cmd_%d", k), "allowed", fmt.Sprintf("req_%d", k), "10.0.0.7", `{"kind":"diag.run","node_id":"node_0123456789"}`}
}

// BenchmarkAuditLog measures, in one run and per dialect, on one tenant of
// benchRows() rows: raw SHA-256 throughput, the plain read rate of the rows
// (the floor for verify), the seal rate, the verify rate, and prove's p50
// and p99 latency; it prints the ratios. Run it with -benchtime 1x.
func BenchmarkAuditLog(b *testing.B) {
	n := benchRows()
	for _, d := range []struct {
		name string
		open func(testing.TB) *store.DB
	}{{"sqlite", storetest.NewTestSQLite}, {"postgres", storetest.NewTestPostgres}} {
		b.Run(d.name, func(b *testing.B) {
			ctx := context.Background()
			db := d.open(b)
			f := newFixture(b, db, 0)
			bulkInsert(b, db, iam.RootTenant, n)
			if db.Dialect == store.Postgres {
				if _, err := db.ExecContext(ctx, `ANALYZE audit_events`); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for range b.N {
				shaMBps := sha256Throughput()

				t := time.Now()
				if _, err := f.log.Seal(ctx, iam.RootTenant, f.key); err != nil {
					b.Fatal(err)
				}
				seal := time.Since(t)
				if db.Dialect == store.Postgres {
					if _, err := db.ExecContext(ctx, `ANALYZE`); err != nil {
						b.Fatal(err)
					}
				}

				t = time.Now()
				read := plainRead(b, db, iam.RootTenant)
				readDur := time.Since(t)
				if read != n {
					b.Fatalf("read %d rows, want %d", read, n)
				}

				t = time.Now()
				rep, err := f.log.Verify(ctx, iam.RootTenant, f.v, nil)
				verify := time.Since(t)
				if err != nil || !rep.OK() || rep.Rows != int64(n) {
					b.Fatalf("verify: %v %+v", err, rep)
				}

				const proves = 2000
				lat := make([]time.Duration, proves)
				rng := rand.New(rand.NewPCG(1, 2))
				for i := range lat {
					id := fmt.Sprintf("ev_%016d", rng.IntN(n))
					t = time.Now()
					if _, err := f.log.Prove(ctx, iam.RootTenant, id); err != nil {
						b.Fatal(err)
					}
					lat[i] = time.Since(t)
				}
				slices.Sort(lat)
				p50, p99 := lat[proves/2], lat[proves*99/100]

				rate := func(d time.Duration) float64 { return float64(n) / d.Seconds() }
				b.ReportMetric(shaMBps, "sha256-MB/s")
				b.ReportMetric(rate(readDur), "read-rows/s")
				b.ReportMetric(rate(seal), "seal-rows/s")
				b.ReportMetric(rate(verify), "verify-rows/s")
				b.ReportMetric(rate(verify)/rate(readDur), "verify/read")
				b.ReportMetric(float64(p50.Microseconds()), "prove-p50-µs")
				b.ReportMetric(float64(p99.Microseconds()), "prove-p99-µs")
				fmt.Printf("| %s | %d | %.0f MB/s | %.0f | %.0f | %.0f | **%.2f** | %.2f ms | **%.2f ms** |\n",
					d.name, n, shaMBps, rate(readDur), rate(seal), rate(verify), rate(verify)/rate(readDur),
					float64(p50.Microseconds())/1000, float64(p99.Microseconds())/1000)
			}
		})
	}
}

// sha256Throughput hashes 256 MiB in 256-byte messages (the size of a row
// encoding) and returns MB/s: the machine's raw hashing speed.
func sha256Throughput() float64 {
	msg := make([]byte, 256)
	const total = 256 << 20
	t := time.Now()
	var sink byte
	for i := 0; i < total/len(msg); i++ {
		msg[0] = byte(i)
		h := sha256.Sum256(msg)
		sink ^= h[0]
	}
	_ = sink
	return float64(total) / 1e6 / time.Since(t).Seconds()
}

// plainRead reads every sealed row of tenant in seq order, decoding the
// columns and doing nothing else: the rate verify is measured against.
func plainRead(b *testing.B, db *store.DB, tenant string) int {
	rows, err := db.QueryContext(context.Background(), `SELECT seq, id, tenant_id, at, actor, action, resource, outcome, request_id, caller, details FROM audit_events WHERE tenant_id = $1 AND seq IS NOT NULL ORDER BY seq`, tenant)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	n := 0
	var r auditlog.Row
	for rows.Next() {
		if err := rows.Scan(&r.Seq, &r.ID, &r.TenantID, &r.At, &r.Actor, &r.Action, &r.Resource, &r.Outcome, &r.RequestID, &r.Caller, &r.Details); err != nil {
			b.Fatal(err)
		}
		n++
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return n
}
