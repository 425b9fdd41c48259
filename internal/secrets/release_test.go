package secrets

import (
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

var testNow = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// testCert returns a certificate for key's public half.
func testCert(t testing.TB, key crypto.Signer) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "n1"},
		NotBefore: testNow.Add(-time.Hour), NotAfter: testNow.Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// oneTimeKey returns the PKIX DER of a fresh P-256 public key.
func oneTimeKey(t testing.TB) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// goodFacts returns the facts of a request checkRequest accepts, signed
// by key, and the body for edits (re-sign with resign after an edit).
func goodFacts(t testing.TB, key crypto.Signer) requestFacts {
	t.Helper()
	body := &nodev1.SecretRequestBody{NodeId: "n1", Ref: "secret://tabc/db", RequestId: "r0123456789abcdef",
		OneTimeKey: oneTimeKey(t), CommandId: "c1", TimeMs: testNow.UnixMilli()}
	f := requestFacts{
		Session:   pki.NodeIdentity{NodeID: "n1", Serial: "s1"},
		Body:      body,
		Cert:      nodes.CertState{Serial: "s1", NodeID: "n1", Role: pki.RoleNode, NotAfter: testNow.Add(time.Hour), Cert: testCert(t, key)},
		CertKnown: true,
		Now:       testNow,
	}
	resign(t, key, &f)
	return f
}

// resign marshals f.Body and signs it with key.
func resign(t testing.TB, key crypto.Signer, f *requestFacts) {
	t.Helper()
	raw, err := proto.Marshal(f.Body)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := wire.SignNode(key, wire.SecretRequestSigContext, raw)
	if err != nil {
		t.Fatal(err)
	}
	f.RawBody, f.Sig = raw, sig
}

func TestCheckRequest(t *testing.T) {
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	x25519, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	x25519DER, err := x509.MarshalPKIXPublicKey(x25519.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		key    crypto.Signer
		edit   func(f *requestFacts)
		resign bool // sign the edited body again
		want   string
	}{
		{name: "ecdsa ok", key: ecKey, edit: func(*requestFacts) {}},
		{name: "ed25519 ok", key: edKey, edit: func(*requestFacts) {}},
		{name: "no body", key: ecKey, edit: func(f *requestFacts) { f.Body = nil }, want: "body-malformed"},
		{name: "other node's body", key: ecKey, edit: func(f *requestFacts) { f.Body.NodeId = "n2" }, resign: true, want: "wrong-node"},
		{name: "cert unknown", key: ecKey, edit: func(f *requestFacts) { f.CertKnown = false }, want: "cert-unknown"},
		{name: "cert of another node", key: ecKey, edit: func(f *requestFacts) { f.Cert.NodeID = "n2" }, want: "cert-unknown"},
		{name: "revoked", key: ecKey, edit: func(f *requestFacts) { f.Cert.Revoked = true }, want: "cert-revoked"},
		{name: "node-tenant role", key: ecKey, edit: func(f *requestFacts) { f.Cert.Role = pki.RoleNodeTenant }, want: "node-tenant"},
		{name: "other role", key: ecKey, edit: func(f *requestFacts) { f.Cert.Role = "gateway" }, want: "role-not-allowed"},
		{name: "not the session's cert", key: ecKey, edit: func(f *requestFacts) { f.Cert.Serial = "s0" }, want: "cert-not-current"},
		{name: "cert expired", key: ecKey, edit: func(f *requestFacts) { f.Now = f.Cert.NotAfter.Add(time.Millisecond) }, want: "cert-not-current"},
		{name: "no certificate parsed", key: ecKey, edit: func(f *requestFacts) { f.Cert.Cert = nil }, want: "bad-signature"},
		{name: "signed by another key", key: ecKey, edit: func(f *requestFacts) { f.Cert.Cert = testCert(t, other) }, want: "bad-signature"},
		{name: "body changed after signing", key: ecKey, edit: func(f *requestFacts) { f.RawBody = append(f.RawBody, 0) }, want: "bad-signature"},
		{name: "no signature", key: edKey, edit: func(f *requestFacts) { f.Sig = nil }, want: "bad-signature"},
		{name: "too old", key: ecKey, edit: func(f *requestFacts) {
			f.Body.TimeMs = testNow.Add(-ReleaseLifetime - time.Millisecond).UnixMilli()
		}, resign: true, want: "stale"},
		{name: "too new", key: ecKey, edit: func(f *requestFacts) {
			f.Body.TimeMs = testNow.Add(ReleaseLifetime + time.Millisecond).UnixMilli()
		}, resign: true, want: "stale"},
		{name: "at the edge", key: ecKey, edit: func(f *requestFacts) { f.Body.TimeMs = testNow.Add(-ReleaseLifetime).UnixMilli() }, resign: true},
		{name: "short request id", key: ecKey, edit: func(f *requestFacts) { f.Body.RequestId = "r012345678abcde" }, resign: true, want: "request-id-invalid"},
		{name: "long request id", key: ecKey, edit: func(f *requestFacts) { f.Body.RequestId = string(make([]byte, 65)) }, resign: true, want: "request-id-invalid"},
		{name: "no one-time key", key: ecKey, edit: func(f *requestFacts) { f.Body.OneTimeKey = nil }, resign: true, want: "one-time-key-invalid"},
		{name: "one-time key not ECDSA", key: ecKey, edit: func(f *requestFacts) { f.Body.OneTimeKey = x25519DER }, resign: true, want: "one-time-key-invalid"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := goodFacts(t, c.key)
			c.edit(&f)
			if c.resign {
				resign(t, c.key, &f)
			}
			otk, got := checkRequest(f)
			if got != c.want {
				t.Fatalf("reason %q, want %q", got, c.want)
			}
			if (got == "") != (otk != nil) {
				t.Fatalf("reason %q with one-time key %v", got, otk)
			}
		})
	}
}

// FuzzCheckRequest feeds arbitrary bodies, signatures and clock offsets:
// checkRequest never panics, and it never accepts a request whose body is
// not what the session's certificate signed.
func FuzzCheckRequest(f *testing.F) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	good := goodFacts(f, key)
	f.Add(good.RawBody, good.Sig, int64(0), false)
	f.Add(good.RawBody, []byte{}, int64(0), false)
	f.Add([]byte{}, good.Sig, int64(-1), true)
	f.Add([]byte{0x0a, 0x02, 'n', '1'}, good.Sig, int64(ReleaseLifetime), false)
	f.Fuzz(func(t *testing.T, raw, sig []byte, offset int64, revoked bool) {
		facts := good
		facts.RawBody, facts.Sig = raw, sig
		facts.Now = testNow.Add(time.Duration(offset))
		facts.Cert.Revoked = revoked
		var body nodev1.SecretRequestBody
		facts.Body = nil
		if proto.Unmarshal(raw, &body) == nil {
			facts.Body = &body
		}
		otk, reason := checkRequest(facts)
		if reason != "" {
			return
		}
		if otk == nil || revoked || !wire.VerifyNode(&key.PublicKey, wire.SecretRequestSigContext, raw, sig) || body.NodeId != "n1" {
			t.Fatalf("accepted a request it must refuse: body %x sig %x revoked %v", raw, sig, revoked)
		}
	})
}

func TestCheckGrant(t *testing.T) {
	chainErr := errors.New("chain unreadable")
	good := grantFacts{Ref: "secret://tabc/db", CommandLive: true, CommandTenant: "tabc", CommandPayload: []byte(`{"ref":"secret://tabc/db"}`),
		NodeTenant: "tabc", NodeKnown: true, SecretFound: true, TenantState: iam.StateActive}
	cases := []struct {
		name    string
		edit    func(g *grantFacts)
		want    string
		wantErr error
	}{
		{name: "ok", edit: func(*grantFacts) {}},
		{name: "no live command", edit: func(g *grantFacts) { g.CommandLive = false }, want: "not-bound"},
		{name: "payload names another ref", edit: func(g *grantFacts) { g.CommandPayload = []byte(`{"ref":"secret://tabc/other"}`) }, want: "not-bound"},
		{name: "payload not JSON", edit: func(g *grantFacts) { g.CommandPayload = []byte(`{`) }, want: "not-bound"},
		{name: "payload without ref", edit: func(g *grantFacts) { g.CommandPayload = []byte(`{}`) }, want: "not-bound"},
		{name: "malformed ref", edit: func(g *grantFacts) {
			g.Ref, g.CommandPayload = "secret://tabc/UPPER", []byte(`{"ref":"secret://tabc/UPPER"}`)
		}, want: "unknown-ref"},
		{name: "node unknown", edit: func(g *grantFacts) { g.NodeKnown = false }, want: "node-unknown"},
		{name: "another tenant's command", edit: func(g *grantFacts) { g.CommandTenant = "tother" }, want: "tenant-mismatch"},
		{name: "another tenant's node", edit: func(g *grantFacts) { g.NodeTenant = iam.RootTenant }, want: "tenant-mismatch"},
		{name: "fleet secret to tenant work", edit: func(g *grantFacts) {
			g.Ref, g.CommandPayload = Ref(iam.RootTenant, "db"), []byte(`{"ref":"`+Ref(iam.RootTenant, "db")+`"}`)
		}, want: "tenant-mismatch"},
		{name: "secret missing", edit: func(g *grantFacts) { g.SecretFound = false }, want: "unknown-ref"},
		{name: "mismatch before missing", edit: func(g *grantFacts) { g.SecretFound, g.NodeTenant = false, "tother" }, want: "tenant-mismatch"},
		{name: "chain unreadable", edit: func(g *grantFacts) { g.ChainErr = chainErr }, wantErr: chainErr},
		{name: "refusal before chain error", edit: func(g *grantFacts) { g.ChainErr, g.CommandLive = chainErr, false }, want: "not-bound"},
		{name: "suspended", edit: func(g *grantFacts) { g.TenantState = iam.StateSuspended }, want: "tenant-suspended"},
		{name: "deleted", edit: func(g *grantFacts) { g.TenantState = iam.StateDeleted }, want: "tenant-deleted"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := good
			c.edit(&g)
			tenant, reason, err := checkGrant(g)
			if reason != c.want || !errors.Is(err, c.wantErr) {
				t.Fatalf("reason %q err %v, want %q %v", reason, err, c.want, c.wantErr)
			}
			if (reason == "" && err == nil) != (tenant != "") {
				t.Fatalf("tenant %q with reason %q err %v", tenant, reason, err)
			}
		})
	}
}

// FuzzCheckGrant: whatever the payload and tenants, a grant is given only
// when the payload names the reference and all three tenants are one.
func FuzzCheckGrant(f *testing.F) {
	f.Add("secret://tabc/db", []byte(`{"ref":"secret://tabc/db"}`), "tabc", "tabc")
	f.Add(Ref(iam.RootTenant, "db"), []byte(`{"ref":"`+Ref(iam.RootTenant, "db")+`"}`), iam.RootTenant, "tabc")
	f.Add("secret://tabc/db", []byte(`{"ref":"secret://tabc/db","ref":"x"}`), "tabc", "tabc")
	f.Add("", []byte(`null`), "", "")
	f.Fuzz(func(t *testing.T, ref string, payload []byte, commandTenant, nodeTenant string) {
		g := grantFacts{Ref: ref, CommandLive: true, CommandTenant: commandTenant, CommandPayload: payload,
			NodeTenant: nodeTenant, NodeKnown: true, SecretFound: true, TenantState: iam.StateActive}
		tenant, reason, err := checkGrant(g)
		if err != nil {
			t.Fatalf("error %v with no chain error", err)
		}
		if reason != "" {
			return
		}
		secretTenant, _, ok := ParseRef(ref)
		if !ok || tenant != secretTenant || tenant != commandTenant || tenant != nodeTenant || !payloadNames(payload, ref) {
			t.Fatalf("granted %q for ref %q payload %q command %q node %q", tenant, ref, payload, commandTenant, nodeTenant)
		}
	})
}

// TestCheckSubjectGrant: a sandbox command a module runs on a fleet host
// for a tenant gets that tenant's own secret only while it is live, is a
// sandbox create or claim, names the reference as an env value, and the
// secret is tenant-scoped: never another tenant's, never a fleet secret.
func TestCheckSubjectGrant(t *testing.T) {
	ref := "secret://tabc/db"
	good := grantFacts{Ref: ref, CommandLive: true, CommandTenant: iam.RootTenant, CommandSubject: "tabc", CommandKind: kindSandboxCreate,
		CommandPayload: []byte(`{"sandbox_id":"sbx_1","env":{"DB":"` + ref + `"}}`),
		NodeTenant:     iam.RootTenant, NodeKnown: true, SecretFound: true, SecretScope: ScopeTenant, TenantState: iam.StateActive}
	cases := []struct {
		name string
		edit func(g *grantFacts)
		want string
	}{
		{name: "create", edit: func(*grantFacts) {}},
		{name: "claim", edit: func(g *grantFacts) { g.CommandKind = kindSandboxUpdate }},
		{name: "no live command", edit: func(g *grantFacts) { g.CommandLive = false }, want: "not-bound"},
		{name: "exec", edit: func(g *grantFacts) { g.CommandKind = "sandbox.exec" }, want: "not-bound"},
		{name: "exec naming it", edit: func(g *grantFacts) {
			g.CommandKind, g.CommandPayload = kindSandboxExec, []byte(`{"sandbox_id":"sbx_1","env_refs":["`+ref+`"]}`)
		}},
		{name: "exec naming another", edit: func(g *grantFacts) {
			g.CommandKind, g.CommandPayload = kindSandboxExec, []byte(`{"sandbox_id":"sbx_1","env_refs":["secret://tabc/other"]}`)
		}, want: "not-bound"},
		{name: "other kind", edit: func(g *grantFacts) { g.CommandKind = "secret.digest" }, want: "not-bound"},
		{name: "ref field, not env", edit: func(g *grantFacts) { g.CommandPayload = []byte(`{"ref":"` + ref + `"}`) }, want: "not-bound"},
		{name: "env names another", edit: func(g *grantFacts) { g.CommandPayload = []byte(`{"env":{"DB":"secret://tabc/other"}}`) }, want: "not-bound"},
		{name: "ref inside a value", edit: func(g *grantFacts) { g.CommandPayload = []byte(`{"env":{"DB":"x ` + ref + `"}}`) }, want: "not-bound"},
		{name: "ref as a key", edit: func(g *grantFacts) { g.CommandPayload = []byte(`{"env":{"` + ref + `":"x"}}`) }, want: "not-bound"},
		{name: "another tenant's secret", edit: func(g *grantFacts) {
			g.Ref, g.CommandPayload = "secret://tother/db", []byte(`{"env":{"DB":"secret://tother/db"}}`)
		}, want: "tenant-mismatch"},
		{name: "fleet secret named", edit: func(g *grantFacts) {
			r := Ref(iam.RootTenant, "db")
			g.Ref, g.CommandPayload = r, []byte(`{"env":{"DB":"`+r+`"}}`)
		}, want: "tenant-mismatch"},
		{name: "fleet-scoped secret of the root subject", edit: func(g *grantFacts) {
			r := Ref(iam.RootTenant, "db")
			g.Ref, g.CommandPayload, g.CommandSubject, g.SecretScope = r, []byte(`{"env":{"DB":"`+r+`"}}`), iam.RootTenant, ScopeFleet
		}, want: "unknown-ref"},
		{name: "node of another tenant", edit: func(g *grantFacts) { g.NodeTenant = "tother" }, want: "tenant-mismatch"},
		{name: "command and node of one other tenant", edit: func(g *grantFacts) { g.CommandTenant, g.NodeTenant = "tother", "tother" }, want: "tenant-mismatch"},
		{name: "command and node of the subject tenant", edit: func(g *grantFacts) { g.CommandTenant, g.NodeTenant = "tabc", "tabc" }, want: "tenant-mismatch"},
		{name: "node unknown", edit: func(g *grantFacts) { g.NodeKnown = false }, want: "node-unknown"},
		{name: "secret missing", edit: func(g *grantFacts) { g.SecretFound = false }, want: "unknown-ref"},
		{name: "suspended", edit: func(g *grantFacts) { g.TenantState = iam.StateSuspended }, want: "tenant-suspended"},
		{name: "deleted", edit: func(g *grantFacts) { g.TenantState = iam.StateDeleted }, want: "tenant-deleted"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := good
			c.edit(&g)
			tenant, reason, err := checkGrant(g)
			if reason != c.want || err != nil {
				t.Fatalf("reason %q err %v, want %q", reason, err, c.want)
			}
			if (reason == "") != (tenant == "tabc" || (tenant == iam.RootTenant && g.CommandSubject == iam.RootTenant)) {
				t.Fatalf("tenant %q with reason %q", tenant, reason)
			}
		})
	}
}

// TestCheckEnvKeyGrant: a sandbox's env data key (sealed-env-key:TENANT/SANDBOX)
// goes only to a live subject command about that very sandbox that needs
// it (a create or claim whose env holds a value sealed for the tenant, an
// exec naming the key in env_refs), on a node of the command's tenant, for
// the command's subject tenant; every other request is refused by reason.
func TestCheckEnvKeyGrant(t *testing.T) {
	const sbx = "sbxaaaaaaaaaaaaaaaa"
	ref := spec.EnvKeyRef("tabc", sbx)
	sealed := spec.SealedEnvPrefix + "tabc:AAAA"
	good := grantFacts{Ref: ref, CommandLive: true, CommandTenant: iam.RootTenant, CommandSubject: "tabc", CommandKind: kindSandboxCreate,
		CommandPayload: []byte(`{"sandbox_id":"` + sbx + `","env":{"A":"` + sealed + `"}}`),
		NodeTenant:     iam.RootTenant, NodeKnown: true, TenantState: iam.StateActive}
	cases := []struct {
		name string
		edit func(g *grantFacts)
		want string
	}{
		{name: "create", edit: func(*grantFacts) {}},
		{name: "claim", edit: func(g *grantFacts) { g.CommandKind = kindSandboxUpdate }},
		{name: "exec naming the key", edit: func(g *grantFacts) {
			g.CommandKind, g.CommandPayload = kindSandboxExec, []byte(`{"sandbox_id":"`+sbx+`","env_refs":["`+ref+`"]}`)
		}},
		{name: "exec not naming the key", edit: func(g *grantFacts) {
			g.CommandKind, g.CommandPayload = kindSandboxExec, []byte(`{"sandbox_id":"`+sbx+`","argv":["`+ref+`"]}`)
		}, want: "not-bound"},
		{name: "exec of another sandbox", edit: func(g *grantFacts) {
			g.CommandKind, g.CommandPayload = kindSandboxExec, []byte(`{"sandbox_id":"sbxbbbbbbbbbbbbbbbb","env_refs":["`+ref+`"]}`)
		}, want: "not-bound"},
		{name: "create without sealed values", edit: func(g *grantFacts) {
			g.CommandPayload = []byte(`{"sandbox_id":"` + sbx + `","env":{"A":"secret://tabc/db"}}`)
		}, want: "not-bound"},
		{name: "create of another sandbox", edit: func(g *grantFacts) {
			g.CommandPayload = []byte(`{"sandbox_id":"sbxbbbbbbbbbbbbbbbb","env":{"A":"` + sealed + `"}}`)
		}, want: "not-bound"},
		{name: "values sealed for another tenant", edit: func(g *grantFacts) {
			g.CommandPayload = []byte(`{"sandbox_id":"` + sbx + `","env":{"A":"` + spec.SealedEnvPrefix + `tother:AAAA"}}`)
		}, want: "not-bound"},
		{name: "dead command", edit: func(g *grantFacts) { g.CommandLive = false }, want: "not-bound"},
		{name: "not a subject command", edit: func(g *grantFacts) { g.CommandSubject = "" }, want: "not-bound"},
		{name: "ref field of a generic command", edit: func(g *grantFacts) {
			g.CommandSubject, g.CommandKind, g.CommandPayload = "", "secret.digest", []byte(`{"ref":"`+ref+`"}`)
		}, want: "unknown-ref"},
		{name: "other kind", edit: func(g *grantFacts) { g.CommandKind = "sandbox.checkpoint" }, want: "not-bound"},
		{name: "another subject tenant", edit: func(g *grantFacts) { g.CommandSubject = "tother" }, want: "tenant-mismatch"},
		{name: "another node", edit: func(g *grantFacts) { g.NodeTenant = "tother" }, want: "tenant-mismatch"},
		{name: "command and node of one other tenant", edit: func(g *grantFacts) { g.CommandTenant, g.NodeTenant = "tother", "tother" }, want: "tenant-mismatch"},
		{name: "node unknown", edit: func(g *grantFacts) { g.NodeKnown = false }, want: "node-unknown"},
		{name: "suspended", edit: func(g *grantFacts) { g.TenantState = iam.StateSuspended }, want: "tenant-suspended"},
		{name: "deleted", edit: func(g *grantFacts) { g.TenantState = iam.StateDeleted }, want: "tenant-deleted"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := good
			c.edit(&g)
			tenant, reason, err := checkGrant(g)
			if reason != c.want || err != nil {
				t.Fatalf("reason %q err %v, want %q", reason, err, c.want)
			}
			if (reason == "") != (tenant == "tabc") {
				t.Fatalf("tenant %q with reason %q", tenant, reason)
			}
		})
	}
}

// TestEnvKeyValue: the released env key is the data key the control plane
// seals with, so it opens the sandbox's values, and only for that tenant
// and sandbox.
func TestEnvKeyValue(t *testing.T) {
	kek := pki.KEK{1, 2, 3}
	s := &Service{kek: kek}
	const sbx = "sbxaaaaaaaaaaaaaaaa"
	k := spec.EnvDataKey(spec.EnvKey(kek), "tabc", sbx)
	v, err := spec.SealEnvValue(k, "tabc", sbx, "A", "hello")
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.value(spec.EnvKeyRef("tabc", sbx), "tabc", sealedSecret{})
	if err != nil {
		t.Fatal(err)
	}
	var gk pki.KEK
	copy(gk[:], got)
	if plain, err := spec.OpenEnvValue(gk, sbx, "A", v); err != nil || plain != "hello" {
		t.Fatalf("released key opens %q, %v", plain, err)
	}
	other, _ := s.value(spec.EnvKeyRef("tother", sbx), "tother", sealedSecret{})
	copy(gk[:], other)
	if _, err := spec.OpenEnvValue(gk, sbx, "A", v); err == nil {
		t.Fatal("another tenant's key opens the value")
	}
}
