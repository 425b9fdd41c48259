package server_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// Keys go only to the roles that use them: a gateway-only process refuses
// a key-encryption key and needs its own certificate and the api's
// internal address; the api and workers roles refuse the bundle's public
// half or no KEK (INVALID_CONFIG).
func TestStartGivesKeysOnlyToRolesThatUseThem(t *testing.T) {
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
	caKey, err := b.InternalCAKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.IssueGatewayCert(b.InternalCA, caKey, b.TrustDomain, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteGatewayFiles(filepath.Join(dir, "gw"), cert); err != nil {
		t.Fatal(err)
	}
	pub, err := pki.LoadPublic(filepath.Join(dir, "gw"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	gw := []string{server.RoleGateway}
	for name, o := range map[string]server.Options{
		"gateway-only given the KEK":         {DB: db, Bundle: pub, KEK: kek, Roles: gw, GatewayCert: &cert, Control: "127.0.0.1:1"},
		"gateway-only without a certificate": {DB: db, Bundle: pub, Roles: gw, Control: "127.0.0.1:1"},
		"gateway-only without the api":       {DB: db, Bundle: pub, Roles: gw, GatewayCert: &cert},
		"api from the public half":           {DB: db, Bundle: pub, KEK: kek, Roles: []string{server.RoleAPI}},
		"workers without the KEK":            {DB: db, Bundle: b, Roles: []string{server.RoleWorkers}},
	} {
		t.Run(name, func(t *testing.T) {
			o.Log = log
			cp, err := server.Start(ctx, o)
			if errs.CodeOf(err) != errs.InvalidConfig {
				if cp != nil {
					cp.Close()
				}
				t.Fatalf("got %v, want INVALID_CONFIG", err)
			}
		})
	}
	cp, err := server.Start(ctx, server.Options{DB: db, Bundle: pub, Roles: gw, GatewayCert: &cert, Control: "127.0.0.1:1", Log: log})
	if err != nil {
		t.Fatalf("a complete gateway-only process: %v", err)
	}
	defer cp.Close()
	if cp.Signer != nil || cp.Secrets != nil {
		t.Fatal("a gateway-only process built a signer or the secrets module")
	}
}
