package integration

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/secrets"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// joinToken joins a started sim node with tok through the real bcd join
// path.
func joinToken(t *testing.T, e *testenv.Env, tok string) *testenv.Node {
	t.Helper()
	dir := filepath.Join(e.Dir, "nodes", ids.New("j"))
	if _, err := daemon.Join(context.Background(), daemon.JoinOptions{DataDir: dir, Gateway: e.CP.GatewayAddr, Token: tok}); err != nil {
		t.Fatalf("join: %v", err)
	}
	n := e.OpenNode(t, dir, "")
	n.Start(t)
	n.WaitConnected(t)
	return n
}

// joinIn joins a node to tenant with a token of role minted straight in
// the nodes module, as a token minted before the join-role rule was.
func joinIn(t *testing.T, e *testenv.Env, tenant, role string) *testenv.Node {
	t.Helper()
	tok, err := e.CP.Nodes.CreateJoinToken(context.Background(), audit.Entry{TenantID: tenant, Actor: "test"}, role, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return joinToken(t, e, tok.Token)
}

// commandRow writes a command of tenant for nodeID carrying ref in state
// (sent: as if the node were running it; queued: the workers sign it and
// the gateway delivers it), bypassing commands.create and its checks.
func commandRow(t *testing.T, e *testenv.Env, tenant, nodeID, state string, payload any) string {
	t.Helper()
	id := ids.New("c")
	now := time.Now().UnixMilli()
	p, _ := json.Marshal(payload)
	if _, err := e.CP.DB.ExecContext(context.Background(), `INSERT INTO commands (id, tenant_id, node_id, kind, payload, state, created_by, created_at, updated_at, expires_at)
		VALUES ($1, $2, $3, 'secret.digest', $4, $5, 'test', $6, $6, $7)`, id, tenant, nodeID, p, state, now, now+600000); err != nil {
		t.Fatal(err)
	}
	return id
}

// expectRefusedFor is expectSecretRefused for the request of commandID
// itself: its own refusal event carries reason.
func expectRefusedFor(t *testing.T, e *testenv.Env, err error, reason, commandID string) {
	t.Helper()
	expectSecretRefused(t, e, err, reason)
	for _, ev := range events(t, e, secrets.EventRefused) {
		if ev.Details["command_id"] == commandID {
			if ev.Details["reason"] != reason {
				t.Fatalf("request for %s refused %v, want %s", commandID, ev.Details["reason"], reason)
			}
			return
		}
	}
	t.Fatalf("no refusal recorded for %s", commandID)
}

func releaseCount(t *testing.T, e *testenv.Env, ref string) int {
	t.Helper()
	var n int
	if err := e.CP.DB.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM audit_events WHERE action = 'compute:secrets:release' AND resource = $1`, ref).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSecretBrokerTenantMismatch checks that the broker releases a secret
// only when its tenant is the command's tenant and the node's tenant: a
// fleet (root) secret only to root work on a root node, a tenant's secret
// only to that tenant's work on that tenant's node, whatever a live
// command's payload names. Commands are written straight to the database,
// so the broker refuses on its own, without any check at create.
func TestSecretBrokerTenantMismatch(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		a, err := e.Client.CreateTenant(ctx, "", "tenant-a")
		if err != nil {
			t.Fatal(err)
		}
		b, err := e.Client.CreateTenant(ctx, "", "tenant-b")
		if err != nil {
			t.Fatal(err)
		}
		aRef := putSecret(t, e, a.ID, "a-secret")
		fleet, err := e.CP.Secrets.Put(ctx, admin, "root", "site-bmc", secrets.ScopeFleet, []byte("fleet-value"))
		if err != nil {
			t.Fatal(err)
		}
		rootRef := putSecret(t, e, "root", "root-secret")
		rootNode := joinIn(t, e, "root", pki.RoleNode)
		aNode := joinIn(t, e, a.ID, pki.RoleNode)
		// A role-node machine in tenant B, as a token minted before the
		// join-role rule could make it.
		bNode := joinIn(t, e, b.ID, pki.RoleNode)

		for _, c := range []struct {
			name          string
			ref           string
			commandTenant string
			node          *testenv.Node
		}{
			{"another tenant's secret for B's work on B's node", aRef, b.ID, bNode},
			{"a fleet secret for B's work on B's node", fleet.Ref, b.ID, bNode},
			{"a root secret for B's work on B's node", rootRef, b.ID, bNode},
			{"a fleet secret for root's command on B's node", fleet.Ref, "root", bNode},
			{"a tenant's secret for root's command on B's node", aRef, "root", bNode},
			{"a tenant's secret for its own work on a root node", aRef, a.ID, rootNode},
			{"a tenant's secret for root's work on a root node", aRef, "root", rootNode},
			{"a fleet secret for root's work on a tenant's node", fleet.Ref, "root", aNode},
			{"a fleet secret for the tenant's work on its node", fleet.Ref, a.ID, aNode},
		} {
			t.Run(c.name, func(t *testing.T) {
				cmd := commandRow(t, e, c.commandTenant, c.node.NodeID(), "sent", map[string]string{"ref": c.ref})
				_, err := request(t, c.node, &nodev1.SecretRequestBody{NodeId: c.node.NodeID(), Ref: c.ref, CommandId: cmd})
				expectRefusedFor(t, e, err, "tenant-mismatch", cmd)
			})
		}
		for _, ref := range []string{aRef, fleet.Ref, rootRef} {
			if n := releaseCount(t, e, ref); n != 0 {
				t.Fatalf("%s released %d times across tenants", ref, n)
			}
		}
		// The matching cases are released.
		for _, c := range []struct {
			ref, tenant string
			node        *testenv.Node
		}{{aRef, a.ID, aNode}, {fleet.Ref, "root", rootNode}, {rootRef, "root", rootNode}} {
			cmd := commandRow(t, e, c.tenant, c.node.NodeID(), "sent", map[string]string{"ref": c.ref})
			if _, err := request(t, c.node, &nodev1.SecretRequestBody{NodeId: c.node.NodeID(), Ref: c.ref, CommandId: cmd}); err != nil {
				t.Fatalf("%s for %s on its own node: %v", c.ref, c.tenant, err)
			}
		}
	})
}

// TestTenantJoinedMachineGetsNoSecrets is the outside testers' attack:
// tenant B's operator mints a join token, joins a machine it controls and
// has a command on it name tenant A's secret and a fleet secret. B can
// mint only node-tenant tokens (a role-node, ramdisk or site token is
// INVALID_INPUT; the default is node-tenant, while root's default stays
// node), the broker refuses B's machine, and the value never reaches it:
// not through the node's own secret.digest, not through a request the
// machine's owner forges with its key, not in its data directory.
func TestTenantJoinedMachineGetsNoSecrets(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		_, aClient := e.TenantAdmin(t, "victim")
		bID, bClient := e.TenantAdmin(t, "attacker")
		aValue := []byte("tenant-a-value-" + ids.Secret(16))
		var aMeta secrets.Meta
		if err := aClient.Call(ctx, "secrets.put", map[string]any{"name": "db-password", "value_base64": b64(aValue)}, &aMeta); err != nil {
			t.Fatal(err)
		}
		fleetValue := []byte("fleet-value-" + ids.Secret(16))
		fleet, err := e.CP.Secrets.Put(ctx, admin, "root", "site-bmc", secrets.ScopeFleet, fleetValue)
		if err != nil {
			t.Fatal(err)
		}

		// B cannot mint a platform role.
		for _, role := range []string{pki.RoleNode, pki.RoleRamdisk, pki.RoleSite} {
			var tok client.JoinToken
			err := bClient.Call(ctx, "joinTokens.create", map[string]any{"role": role}, &tok)
			if !errors.Is(err, client.ErrInvalidInput) {
				t.Fatalf("tenant mints a %s token: %v, want INVALID_INPUT", role, err)
			}
			err = bClient.Call(ctx, "joinTokens.createMany", map[string]any{"role": role, "count": 2}, nil)
			if !errors.Is(err, client.ErrInvalidInput) {
				t.Fatalf("tenant mints %s tokens in bulk: %v, want INVALID_INPUT", role, err)
			}
		}
		var many struct{ Tokens []client.JoinToken }
		if err := bClient.Call(ctx, "joinTokens.createMany", map[string]any{"count": 2}, &many); err != nil || len(many.Tokens) != 2 || many.Tokens[0].Role != pki.RoleNodeTenant {
			t.Fatalf("tenant's default bulk tokens: %+v %v, want node-tenant", many, err)
		}
		var rootTok client.JoinToken
		if err := e.Client.Call(ctx, "joinTokens.create", map[string]any{}, &rootTok); err != nil || rootTok.Role != pki.RoleNode {
			t.Fatalf("root's default token: %+v %v, want node", rootTok, err)
		}
		var tok client.JoinToken
		if err := bClient.Call(ctx, "joinTokens.create", map[string]any{}, &tok); err != nil || tok.Role != pki.RoleNodeTenant {
			t.Fatalf("tenant's default token: %+v %v, want node-tenant", tok, err)
		}
		bNode := joinToken(t, e, tok.Token)
		if nt, err := e.CP.Nodes.TenantOf(ctx, bNode.NodeID()); err != nil || nt != bID {
			t.Fatalf("B's machine is in %q (%v), want %s", nt, err, bID)
		}

		// Commands on B's machine naming A's secret and the fleet secret,
		// as B's work and as root's; B's machine runs what reaches it.
		nonce := hex.EncodeToString([]byte(ids.Secret(16)))
		var queued []string
		for _, ref := range []string{aMeta.Ref, fleet.Ref} {
			for _, tenant := range []string{bID, "root"} {
				queued = append(queued, commandRow(t, e, tenant, bNode.NodeID(), "queued", map[string]string{"ref": ref, "nonce": nonce}))
				// B holds root on its machine: it asks the broker itself,
				// with its node key, for a command that names the secret.
				cmd := commandRow(t, e, tenant, bNode.NodeID(), "sent", map[string]string{"ref": ref})
				_, err := request(t, bNode, &nodev1.SecretRequestBody{NodeId: bNode.NodeID(), Ref: ref, CommandId: cmd})
				expectRefusedFor(t, e, err, "node-tenant", cmd)
			}
		}
		for _, id := range queued {
			if c := e.WaitCommand(t, id); c.State == "succeeded" || len(c.Result) > 0 && !bytes.Equal(c.Result, []byte("null")) {
				t.Fatalf("command %s on B's machine: %s result %s", id, c.State, c.Result)
			}
		}
		for _, ref := range []string{aMeta.Ref, fleet.Ref} {
			if n := releaseCount(t, e, ref); n != 0 {
				t.Fatalf("%s released %d times to B's machine", ref, n)
			}
		}
		bNode.Stop()
		err = filepath.WalkDir(bNode.Dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			raw, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, v := range [][]byte{aValue, fleetValue, []byte(b64(aValue)), []byte(b64(fleetValue))} {
				if bytes.Contains(raw, v) {
					t.Fatalf("a secret value reached B's machine: %s", p)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

func b64(v []byte) string { return base64.StdEncoding.EncodeToString(v) }

// TestConcurrentSecretPutsStayDense puts one name 20 times at once through
// the API: every put succeeds (puts of one reference are serialised), the
// versions are exactly 1..20, and the latest version opens.
func TestConcurrentSecretPutsStayDense(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		const n = 20
		errc := make(chan error, n)
		versions := make(chan int64, n)
		for i := range n {
			go func() {
				var m secrets.Meta
				err := e.Client.Call(ctx, "secrets.put", map[string]any{"name": "racy", "value_base64": b64([]byte(fmt.Sprintf("value-%d", i)))}, &m)
				versions <- m.Version
				errc <- err
			}()
		}
		seen := map[int64]bool{}
		for range n {
			if err := <-errc; err != nil {
				t.Errorf("concurrent put: %v", err)
			}
			seen[<-versions] = true
		}
		if t.Failed() {
			t.FailNow()
		}
		rows, err := db.QueryContext(ctx, `SELECT version FROM secrets WHERE ref = 'secret://root/racy' ORDER BY version`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var want int64 = 1
		for rows.Next() {
			var v int64
			if err := rows.Scan(&v); err != nil {
				t.Fatal(err)
			}
			if v != want || !seen[v] {
				t.Fatalf("version %d stored (answered: %v), want %d", v, seen[v], want)
			}
			want++
		}
		if err := rows.Err(); err != nil || want != n+1 {
			t.Fatalf("%d versions stored (%v), want %d", want-1, err, n)
		}
	})
}

// TestTenantPutNeverOverwritesFleetSecret checks the scope rule against the
// latest version, not the largest scope name: a name that was tenant-scoped
// once and is now the fleet's cannot be overwritten or deleted by a
// tenant-scoped call (INVALID_STATE), and stays the fleet's, unchanged.
func TestTenantPutNeverOverwritesFleetSecret(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		if _, err := e.CP.Secrets.Put(ctx, admin, "root", "shared", secrets.ScopeTenant, []byte("v1")); err != nil {
			t.Fatal(err)
		}
		fleet, err := e.CP.Secrets.Put(ctx, admin, "root", "shared", secrets.ScopeFleet, []byte("v2"))
		if err != nil || fleet.Version != 2 {
			t.Fatalf("fleet put: %+v %v", fleet, err)
		}
		var m secrets.Meta
		err = e.Client.Call(ctx, "secrets.put", map[string]any{"name": "shared", "scope": "tenant", "value_base64": b64([]byte("v3"))}, &m)
		if !errors.Is(err, client.ErrInvalidState) {
			t.Fatalf("tenant-scoped put over a fleet secret: %+v %v, want INVALID_STATE", m, err)
		}
		if err := e.CP.Secrets.Delete(ctx, admin, fleet.Ref, secrets.ScopeTenant); errs.CodeOf(err) != errs.InvalidState {
			t.Fatalf("tenant-scoped delete of a fleet secret: %v, want INVALID_STATE", err)
		}
		got, err := e.CP.Secrets.Show(ctx, fleet.Ref)
		if err != nil || got.Version != 2 || got.Scope != secrets.ScopeFleet {
			t.Fatalf("the fleet secret is now %+v (%v), want version 2, fleet", got, err)
		}
	})
}

// TestSecretsGetForeignAnswersAsMissing checks that tenant B asking for
// tenant A's existing secret, for a missing name of A, and for a secret of
// a tenant that does not exist gets byte-for-byte the same answer and goes
// down the same path: the envelope's denial is recorded with the same
// reason for all three (the reference's tenant is read from the reference,
// never looked up; internal/secrets.TestTenantOfReadsNothing shows the
// resolver reads nothing), so neither the answer nor the work tells which
// tenants hold secrets.
func TestSecretsGetForeignAnswersAsMissing(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		aID, aClient := e.TenantAdmin(t, "holder")
		if err := aClient.Call(ctx, "secrets.put", map[string]any{"name": "db-password", "value_base64": b64([]byte("x"))}, nil); err != nil {
			t.Fatal(err)
		}
		bID, err := e.Client.CreateTenant(ctx, "", "asker")
		if err != nil {
			t.Fatal(err)
		}
		who, err := e.Client.CreateIdentity(ctx, bID.ID, "asker-admin", "person")
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Client.Bind(ctx, bID.ID, who.ID, "admin"); err != nil {
			t.Fatal(err)
		}
		key, err := e.Client.CreateAPIKey(ctx, bID.ID, who.ID, "k", 0)
		if err != nil {
			t.Fatal(err)
		}
		get := func(ref, rid string) (int, []byte) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+e.CP.APIAddr+"/api/v1/secrets.get", strings.NewReader(`{"ref":"`+ref+`"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Better-Compute", "1")
			req.Header.Set("Authorization", "Bearer "+key.Key)
			req.Header.Set("X-Request-Id", rid)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			// The denial names the reference the caller gave, as given.
			body = bytes.ReplaceAll(body, []byte(ref), []byte("REF"))
			return resp.StatusCode, bytes.ReplaceAll(body, []byte(rid), []byte("RID"))
		}
		refs := map[string]string{
			"existing":       secrets.Ref(aID, "db-password"),
			"missing-name":   secrets.Ref(aID, "nothing-here"),
			"missing-tenant": secrets.Ref("tnosuchtenant", "db-password"),
		}
		var first []byte
		for what, ref := range refs {
			rid := "rid-" + what
			status, body := get(ref, rid)
			if status != http.StatusForbidden || !bytes.Contains(body, []byte(`"ACCESS_DENIED"`)) {
				t.Fatalf("%s: %d %s, want 403 ACCESS_DENIED", what, status, body)
			}
			if first == nil {
				first = body
			} else if !bytes.Equal(body, first) {
				t.Fatalf("%s answers %s, another answers %s", what, body, first)
			}
			var details string
			if err := db.QueryRowContext(ctx, `SELECT details FROM audit_events WHERE request_id = $1 AND outcome = 'denied'`, rid).Scan(&details); err != nil {
				t.Fatalf("%s: denial row: %v", what, err)
			}
			var d struct{ Reason string }
			if err := json.Unmarshal([]byte(details), &d); err != nil || d.Reason != api.ReasonOutOfReach {
				t.Fatalf("%s: denied for %q (%v), want out-of-reach as for every reference of another tenant", what, d.Reason, err)
			}
		}
	})
}

// TestSecretBrokerOwnRefusals drives the broker's own checks, behind the
// gateway's authentication: a request whose signature does not verify
// (bad-signature), one stamped more than 5 minutes from the broker's time
// either way (stale), one signed under a revoked certificate
// (cert-revoked), one whose certificate is not the session's or has
// expired (cert-not-current). Each is one ACCESS_DENIED with its reason in
// security.secret.refused, and nothing is released. A good request is
// answered with a JWE (ECDH-ES+A256KW, A256GCM, typ bc-secret+jwe) to the
// request's one-time key, expiring exactly ReleaseLifetime (5 minutes)
// after the broker's time, in its header and in its sealed payload.
func TestSecretBrokerOwnRefusals(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		clk := clock.NewFake(time.Now())
		e := testenv.Start(t, db, testenv.Options{Clock: clk, NodeCertLifetime: time.Hour})
		ctx := context.Background()
		n := joinIn(t, e, "root", pki.RoleNode)
		ref := putSecret(t, e, "root", "bmc")
		cmd := commandRow(t, e, "root", n.NodeID(), "sent", map[string]string{"ref": ref})
		good := func() *nodev1.SecretRequestBody {
			return &nodev1.SecretRequestBody{NodeId: n.NodeID(), Ref: ref, CommandId: cmd}
		}
		sendRaw := func(req *nodev1.SecretRequest) error {
			_, err := sendSecret(t, n, req)
			return err
		}
		sign := func(b *nodev1.SecretRequestBody) *nodev1.SecretRequest {
			if b.OneTimeKey == nil {
				k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
				b.OneTimeKey, _ = x509.MarshalPKIXPublicKey(&k.PublicKey)
			}
			if b.RequestId == "" {
				b.RequestId = ids.Secret(18)
			}
			req, err := n.SignSecretRequest(b)
			if err != nil {
				t.Fatal(err)
			}
			return req
		}

		t.Run("jwe to the one-time key, expiring in 5 minutes", func(t *testing.T) {
			otk, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			b := good()
			b.OneTimeKey, _ = x509.MarshalPKIXPublicKey(&otk.PublicKey)
			resp, err := request(t, n, b)
			if err != nil {
				t.Fatal(err)
			}
			obj, err := jose.ParseEncryptedCompact(resp.Jwe, []jose.KeyAlgorithm{jose.ECDH_ES_A256KW}, []jose.ContentEncryption{jose.A256GCM})
			if err != nil {
				t.Fatalf("answer is not an ECDH-ES+A256KW/A256GCM JWE: %v", err)
			}
			wantExp := clk.Now().Add(secrets.ReleaseLifetime).Unix()
			if obj.Header.ExtraHeaders["typ"] != "bc-secret+jwe" || obj.Header.ExtraHeaders["exp"] != float64(wantExp) {
				t.Fatalf("protected header %+v, want typ bc-secret+jwe and exp %d", obj.Header.ExtraHeaders, wantExp)
			}
			other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if _, err := obj.Decrypt(other); err == nil {
				t.Fatal("the answer opens under another key")
			}
			plain, err := obj.Decrypt(otk)
			if err != nil {
				t.Fatal(err)
			}
			var p struct {
				Ref     string `json:"ref"`
				Value   string `json:"value"`
				Exp     int64  `json:"exp"`
				Request string `json:"request_id"`
			}
			if err := json.Unmarshal(plain, &p); err != nil || p.Ref != ref || p.Exp != wantExp || p.Request != b.RequestId || p.Value != b64([]byte("value-of-bmc")) {
				t.Fatalf("payload %+v (%v)", p, err)
			}
		})
		released := releaseCount(t, e, ref)

		t.Run("bad-signature", func(t *testing.T) {
			req := sign(good())
			req.NodeSig[len(req.NodeSig)/2] ^= 1
			expectSecretRefused(t, e, sendRaw(req), "bad-signature")
			req = sign(good())
			req.Body = append(req.Body, 0x50, 0x01) // a field added after signing
			expectSecretRefused(t, e, sendRaw(req), "bad-signature")
		})
		t.Run("stale", func(t *testing.T) {
			for _, skew := range []time.Duration{-secrets.ReleaseLifetime - time.Second, secrets.ReleaseLifetime + time.Second} {
				b := good()
				b.TimeMs = clk.Now().Add(skew).UnixMilli()
				_, err := request(t, n, b)
				expectSecretRefused(t, e, err, "stale")
			}
		})
		t.Run("cert-not-current", func(t *testing.T) {
			// The request names the node's certificate, but the session
			// is another one of the node's (the gateway authenticated it).
			req := sign(good())
			_, err := e.CP.Secrets.Release(ctx, pki.NodeIdentity{NodeID: n.NodeID(), Serial: "0badc0de"}, req)
			if errs.CodeOf(err) != errs.AccessDenied || !hasReason(t, e, secrets.EventRefused, "cert-not-current") {
				t.Fatalf("another session's certificate: %v", err)
			}
		})
		t.Run("cert-revoked", func(t *testing.T) {
			req := sign(good())
			if _, err := e.CP.Nodes.Revoke(ctx, admin, n.NodeID(), req.CertSerial, "operator"); err != nil {
				t.Fatal(err)
			}
			// Straight to the broker, as from a gateway that has not yet
			// seen the revocation.
			_, err := e.CP.Secrets.Release(ctx, pki.NodeIdentity{NodeID: n.NodeID(), Serial: req.CertSerial}, req)
			if errs.CodeOf(err) != errs.AccessDenied || !hasReason(t, e, secrets.EventRefused, "cert-revoked") {
				t.Fatalf("revoked certificate: %v", err)
			}
		})
		t.Run("role-not-allowed", func(t *testing.T) {
			// A ramdisk or site certificate is the platform's, but is not
			// a node's: it gets no secret either.
			for _, role := range []string{pki.RoleRamdisk, pki.RoleSite} {
				m := joinIn(t, e, "root", role)
				c := commandRow(t, e, "root", m.NodeID(), "sent", map[string]string{"ref": ref})
				_, err := request(t, m, &nodev1.SecretRequestBody{NodeId: m.NodeID(), Ref: ref, CommandId: c})
				expectRefusedFor(t, e, err, "role-not-allowed", c)
			}
		})
		if got := releaseCount(t, e, ref); got != released {
			t.Fatalf("%d releases after refusals, want %d", got, released)
		}
	})
	t.Run("expired certificate is cert-not-current", func(t *testing.T) {
		clk := clock.NewFake(time.Now())
		e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Clock: clk, NodeCertLifetime: time.Hour})
		n := joinIn(t, e, "root", pki.RoleNode)
		ref := putSecret(t, e, "root", "bmc")
		cmd := commandRow(t, e, "root", n.NodeID(), "sent", map[string]string{"ref": ref})
		n.Stop()
		req, err := n.SignSecretRequest(&nodev1.SecretRequestBody{NodeId: n.NodeID(), Ref: ref, CommandId: cmd, RequestId: ids.Secret(18), OneTimeKey: otkPub(t)})
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Hour + time.Minute)
		_, err = e.CP.Secrets.Release(context.Background(), pki.NodeIdentity{NodeID: n.NodeID(), Serial: req.CertSerial}, req)
		if errs.CodeOf(err) != errs.AccessDenied || !hasReason(t, e, secrets.EventRefused, "cert-not-current") {
			t.Fatalf("expired certificate: %v", err)
		}
	})
}

func otkPub(t *testing.T) []byte {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	b, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSecretsPutRefusalsEchoNoValue checks what every secrets.put refusal
// says back: the code it is refused with, and never the value, in clear,
// base64 or hex, nor the raw value_base64 text, in the answer or the log.
func TestSecretsPutRefusalsEchoNoValue(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		logs := &syncBuffer{}
		e := testenv.Start(t, db, testenv.Options{LogTo: logs})
		ctx := context.Background()
		tenant, err := e.Client.CreateTenant(ctx, "", "echo")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.CP.Secrets.Put(ctx, admin, "root", "fleet-one", secrets.ScopeFleet, []byte("x")); err != nil {
			t.Fatal(err)
		}
		value := "v4lue-" + ids.Secret(20)
		enc := b64([]byte(value))
		big := b64(bytes.Repeat([]byte(value), secrets.MaxValue/len(value)+1)[:secrets.MaxValue+1])
		put := func(body string) (int, []byte) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+e.CP.APIAddr+"/api/v1/secrets.put", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Better-Compute", "1")
			req.Header.Set("Authorization", "Bearer "+e.AdminKey)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, b
		}
		for _, c := range []struct {
			name, body, code string
		}{
			{"bad name", `{"name":"Bad Name","value_base64":"` + enc + `"}`, "INVALID_INPUT"},
			{"bad scope", `{"name":"ok","scope":"galaxy","value_base64":"` + enc + `"}`, "INVALID_INPUT"},
			{"fleet outside root", `{"tenant_id":"` + tenant.ID + `","name":"ok","scope":"fleet","value_base64":"` + enc + `"}`, "INVALID_INPUT"},
			{"tenant put over a fleet secret", `{"name":"fleet-one","value_base64":"` + enc + `"}`, "INVALID_STATE"},
			{"not base64", `{"name":"ok","value_base64":"` + value + `!"}`, "INVALID_INPUT"},
			{"too large", `{"name":"ok","value_base64":"` + big + `"}`, "INVALID_INPUT"},
			{"value in an unknown field", `{"name":"ok","value":"` + value + `"}`, "INVALID_INPUT"},
			{"value of the wrong type", `{"name":"ok","value_base64":["` + enc + `"]}`, "INVALID_INPUT"},
			{"value twice", `{"name":"ok","value_base64":"` + enc + `","value_base64":"` + enc + `"}`, "INVALID_INPUT"},
		} {
			status, body := put(c.body)
			if status == http.StatusOK || !bytes.Contains(body, []byte(`"`+c.code+`"`)) {
				t.Fatalf("%s: %d %s, want %s", c.name, status, body, c.code)
			}
			for _, f := range []string{value, enc, hex.EncodeToString([]byte(value)), value[:12], enc[:12]} {
				if bytes.Contains(body, []byte(f)) {
					t.Fatalf("%s: the refusal echoes the value: %s", c.name, body)
				}
			}
		}
		for _, f := range []string{value, enc, hex.EncodeToString([]byte(value))} {
			if bytes.Contains(logs.Bytes(), []byte(f)) {
				t.Fatal("a refused put logged the value")
			}
		}
	})
}
