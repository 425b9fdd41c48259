package server_test

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// TestWorkersRunTheAuditJob: the workers role starts the sealing job with
// its metrics on the process's own registry, and the job seals.
func TestWorkersRunTheAuditJob(t *testing.T) {
	ctx := context.Background()
	db := storetest.NewTestSQLite(t)
	dir := t.TempDir()
	kek, err := pki.CreateKEK(filepath.Join(dir, "kek"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := pki.Init(filepath.Join(dir, "pki"), "srv.bc.local", kek, clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := server.Start(ctx, server.Options{DB: db, Bundle: b, KEK: kek, Roles: []string{server.RoleWorkers},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), AuditSealInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	if cp.Audit == nil || cp.Metrics == nil {
		t.Fatal("workers role without the audit job or a metrics registry")
	}
	mfs, err := cp.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"bc_audit_unsealed_stale_rows", "bc_audit_oldest_unsealed_seconds", "bc_audit_seal_failures_total", "bc_audit_sink_failures_total"} {
		if !names[n] {
			t.Errorf("metric %s not registered", n)
		}
	}
	if err := db.Tx(ctx, func(tx *sql.Tx) error {
		return audit.Record(ctx, tx, time.Now(), audit.Entry{TenantID: iam.RootTenant, Actor: "a", Action: "b", Resource: "c", Outcome: "allowed"})
	}); err != nil {
		t.Fatal(err)
	}
	if err := cp.Audit.SealOnce(ctx); err != nil {
		t.Fatal(err)
	}
	var size int64
	if err := db.QueryRowContext(ctx, `SELECT size FROM audit_checkpoints WHERE tenant_id = $1`, iam.RootTenant).Scan(&size); err != nil || size != 1 {
		t.Fatalf("checkpoint size %d (%v), want 1", size, err)
	}
}
