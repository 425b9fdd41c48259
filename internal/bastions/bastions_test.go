package bastions_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"math/big"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bastion/wgtun"
	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/store"
)

// env is one bastions module over a real database, with a nodes module
// that holds a real node CA so that bastions join as any node does.
type env struct {
	t      *testing.T
	ctx    context.Context
	db     *store.DB
	clk    *clock.Fake
	kek    pki.KEK
	bus    *bus.Bus
	nodes  *nodes.Service
	s      *bastions.Service
	tenant string // a tenant other than root
}

func newEnv(t *testing.T, db *store.DB) *env {
	t.Helper()
	ctx := context.Background()
	clk := clock.NewFake(time.UnixMilli(1_700_000_000_000))
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test node CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: clk.Now().Add(-time.Hour), NotAfter: clk.Now().Add(365 * 24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	b := bus.New()
	log := slog.New(slog.DiscardHandler)
	n := nodes.New(db, clk, audit.NewEvents(db, clk, iam.RootTenant), b, log, quota.New(db, clk, quota.Defaults()),
		nodes.Config{TrustDomain: "test.example", NodeCA: ca, NodeCAKey: caKey, JoinPin: [32]byte{7}})
	var kek pki.KEK
	_, _ = rand.Read(kek[:])
	tn, err := iam.New(db, clk).CreateTenant(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "test"}, iam.RootTenant, "acme")
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, ctx: ctx, db: db, clk: clk, kek: kek, bus: b, nodes: n, s: bastions.New(db, clk, kek, n, b, log), tenant: tn.ID}
}

// actor is an operator of tenant.
func actor(tenant string) audit.Entry {
	return audit.Entry{TenantID: tenant, Actor: "identity/op", RequestID: "req-test"}
}

// pair makes a pairing token in tenant and joins a machine with it, as
// bcd bastion pair does; it returns the bastion's node id and the leaf.
func (e *env) pair(tenant, name string) (string, *x509.Certificate) {
	e.t.Helper()
	tok, err := e.s.PairToken(e.ctx, actor(tenant), name, time.Hour)
	if err != nil {
		e.t.Fatal(err)
	}
	key, err := pki.NewNodeKey()
	if err != nil {
		e.t.Fatal(err)
	}
	csr, err := pki.CSR(key, name)
	if err != nil {
		e.t.Fatal(err)
	}
	id, chain, err := e.nodes.Join(e.ctx, tok.Token, csr, name)
	if err != nil {
		e.t.Fatalf("join with a pairing token: %v", err)
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		e.t.Fatal(err)
	}
	return id, leaf
}

// node inserts a plain node of role in tenant.
func (e *env) node(id, tenant, role string) {
	e.t.Helper()
	if _, err := e.db.ExecContext(e.ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ($1, $2, $3, $4, 0)`, id, tenant, id, role); err != nil {
		e.t.Fatal(err)
	}
}

// wgKey makes a fresh WireGuard public key (base64).
func wgKey(t *testing.T) string {
	t.Helper()
	k, err := wgtun.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k.Public().String()
}

// wantRefusal fails unless err is a *bastions.Refusal with code and reason.
func wantRefusal(t *testing.T, what string, err error, code errs.Code, reason string) {
	t.Helper()
	var r *bastions.Refusal
	if !errors.As(err, &r) || r.Reason != reason || errs.CodeOf(err) != code {
		t.Fatalf("%s: %v (code %s), want %s %s", what, err, errs.CodeOf(err), code, reason)
	}
}

// countAudit counts audit rows of action in tenant (and outcome, when set).
func (e *env) countAudit(tenant, action, outcome string) int {
	e.t.Helper()
	var n int
	q := `SELECT COUNT(*) FROM audit_events WHERE tenant_id = $1 AND action = $2 AND ($3 = '' OR outcome = $3)`
	if err := e.db.QueryRowContext(e.ctx, q, tenant, action, outcome).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}
