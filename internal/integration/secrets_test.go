package integration

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/gateway"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/secrets"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// syncBuffer collects log output from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.b.Bytes()...)
}

// TestSecretDigestEndToEnd puts a secret through the API, has a node fetch
// it through the broker for a secret.digest command, and checks the value
// appears nowhere: not in the database file, the logs, or the data dirs.
func TestSecretDigestEndToEnd(t *testing.T) {
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "control.db")
	db, err := store.Open(context.Background(), "sqlite:"+dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	e := testenv.Start(t, db, testenv.Options{Nodes: 1, LogTo: logs})
	ctx := context.Background()
	value := []byte("s3cr3t-" + ids.Secret(24))
	var meta secrets.Meta
	if err := e.Client.Call(ctx, "secrets.put", map[string]any{"name": "demo", "value_base64": base64.StdEncoding.EncodeToString(value)}, &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Ref != "secret://root/demo" || meta.Version != 1 {
		t.Fatalf("put answered %+v", meta)
	}
	// No method answers the value: put, list and get answer metadata.
	var answers []json.RawMessage
	for _, c := range []struct {
		method string
		in     map[string]any
	}{
		{"secrets.put", map[string]any{"name": "demo", "value_base64": base64.StdEncoding.EncodeToString(value)}},
		{"secrets.list", map[string]any{}},
		{"secrets.get", map[string]any{"ref": "secret://root/demo"}},
	} {
		var raw json.RawMessage
		if err := e.Client.Call(ctx, c.method, c.in, &raw); err != nil {
			t.Fatal(err)
		}
		answers = append(answers, raw)
	}
	nonce := []byte(ids.Secret(16))
	c, err := e.Client.CreateCommand(ctx, e.Nodes[0].NodeID(), "secret.digest", json.RawMessage(`{"ref":"secret://root/demo","nonce":"`+hex.EncodeToString(nonce)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	got := e.WaitCommand(t, c.ID)
	mac := hmac.New(sha256.New, value)
	mac.Write(nonce)
	var res struct {
		HMAC string `json:"hmac_sha256"`
	}
	if err := json.Unmarshal(got.Result, &res); err != nil || got.State != "succeeded" || !got.Attested || res.HMAC != hex.EncodeToString(mac.Sum(nil)) {
		t.Fatalf("secret.digest: %s attested=%v result=%s reason=%q", got.State, got.Attested, got.Result, got.Reason)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE action = 'compute:secrets:release' AND resource = 'secret://root/demo'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d release audit rows (%v), want 1", n, err)
	}
	e.Close()
	// Nor does its unkeyed hash: the command's result is keyed under the
	// caller's nonce.
	unkeyed := sha256.Sum256(value)
	forms := [][]byte{value, []byte(base64.StdEncoding.EncodeToString(value)), []byte(hex.EncodeToString(value)), []byte(hex.EncodeToString(unkeyed[:]))}
	check := func(where string, b []byte) {
		for _, f := range forms {
			if bytes.Contains(b, f) {
				t.Fatalf("the secret value appears in %s", where)
			}
		}
	}
	check("the logs", logs.Bytes())
	for _, a := range answers {
		check("an API answer", a)
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		check(p, b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// secretFixture is an environment with a secret, a node, and a live
// command on that node that carries the secret's reference.
type secretFixture struct {
	e       *testenv.Env
	node    *testenv.Node
	ref     string
	command string
}

func newSecretFixture(t *testing.T, db *store.DB, role string) secretFixture {
	e := testenv.Start(t, db, testenv.Options{})
	n := e.Join(t, role, "")
	n.Start(t)
	n.WaitConnected(t)
	f := secretFixture{e: e, node: n}
	f.ref = putSecret(t, e, "root", "bmc")
	f.command = liveCommand(t, e, n.NodeID(), f.ref)
	return f
}

func putSecret(t *testing.T, e *testenv.Env, tenant, name string) string {
	t.Helper()
	m, err := e.CP.Secrets.Put(context.Background(), admin, tenant, name, "", []byte("value-of-"+name))
	if err != nil {
		t.Fatal(err)
	}
	return m.Ref
}

// liveCommand writes a sent command for nodeID carrying ref, as if the
// node were running it now.
func liveCommand(t *testing.T, e *testenv.Env, nodeID, ref string) string {
	t.Helper()
	id := ids.New("c")
	now := time.Now().UnixMilli()
	payload, _ := json.Marshal(map[string]string{"ref": ref})
	if _, err := e.CP.DB.ExecContext(context.Background(), `INSERT INTO commands (id, tenant_id, node_id, kind, payload, state, created_by, created_at, updated_at, expires_at)
		VALUES ($1, 'root', $2, 'secret.digest', $3, 'sent', 'test', $4, $4, $5)`, id, nodeID, payload, now, now+600000); err != nil {
		t.Fatal(err)
	}
	return id
}

// request sends a secret request over n's own mutual-TLS connection.
func request(t *testing.T, n *testenv.Node, body *nodev1.SecretRequestBody) (*nodev1.SecretResponse, error) {
	t.Helper()
	if body.OneTimeKey == nil {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		body.OneTimeKey, _ = x509.MarshalPKIXPublicKey(&k.PublicKey)
	}
	if body.RequestId == "" {
		body.RequestId = ids.Secret(18)
	}
	req, err := n.SignSecretRequest(body)
	if err != nil {
		t.Fatal(err)
	}
	return sendSecret(t, n, req)
}

// sendSecret sends req as the node does: on its live session's
// connection (the only one the gateway answers a secret request on), or,
// with no session, on a connection of its own (which the gateway refuses,
// by the certificate's state or for want of the session).
func sendSecret(t *testing.T, n *testenv.Node, req *nodev1.SecretRequest) (*nodev1.SecretResponse, error) {
	t.Helper()
	conn := n.SessionConn()
	if conn == nil {
		own, err := n.Dial()
		if err != nil {
			t.Fatal(err)
		}
		defer own.Close()
		conn = own
	}
	return nodev1.NewGatewayClient(conn).Secret(context.Background(), req)
}

func expectSecretRefused(t *testing.T, e *testenv.Env, err error, reason string) {
	t.Helper()
	if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "ACCESS_DENIED" {
		t.Fatalf("got %v, want ACCESS_DENIED", err)
	}
	if !hasReason(t, e, secrets.EventRefused, reason) {
		t.Fatalf("no %s event with reason %q", secrets.EventRefused, reason)
	}
}

func TestSecretBrokerRefusals(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		f := newSecretFixture(t, db, pki.RoleNode)
		e, n := f.e, f.node
		ctx := context.Background()

		// The fixture's request is good: it is released.
		if _, err := request(t, n, &nodev1.SecretRequestBody{NodeId: n.NodeID(), Ref: f.ref, CommandId: f.command}); err != nil {
			t.Fatalf("bound request refused: %v", err)
		}
		t.Run("another node's request", func(t *testing.T) {
			other := e.Join(t, pki.RoleNode, "")
			_, err := request(t, n, &nodev1.SecretRequestBody{NodeId: other.NodeID(), Ref: f.ref, CommandId: f.command})
			expectSecretRefused(t, e, err, "wrong-node")
		})
		t.Run("reference no live command carries", func(t *testing.T) {
			other := putSecret(t, e, "root", "unbound")
			_, err := request(t, n, &nodev1.SecretRequestBody{NodeId: n.NodeID(), Ref: other, CommandId: f.command})
			expectSecretRefused(t, e, err, "not-bound")
			done := liveCommand(t, e, n.NodeID(), other)
			if _, err := db.ExecContext(ctx, `UPDATE commands SET state = 'succeeded' WHERE id = $1`, done); err != nil {
				t.Fatal(err)
			}
			_, err = request(t, n, &nodev1.SecretRequestBody{NodeId: n.NodeID(), Ref: other, CommandId: done})
			expectSecretRefused(t, e, err, "not-bound")
		})
		t.Run("replayed request id", func(t *testing.T) {
			id := ids.Secret(18)
			if _, err := request(t, n, &nodev1.SecretRequestBody{NodeId: n.NodeID(), Ref: f.ref, CommandId: f.command, RequestId: id}); err != nil {
				t.Fatal(err)
			}
			_, err := request(t, n, &nodev1.SecretRequestBody{NodeId: n.NodeID(), Ref: f.ref, CommandId: f.command, RequestId: id})
			expectSecretRefused(t, e, err, "replayed")
		})
		t.Run("suspended tenant", func(t *testing.T) {
			tn, err := e.Client.CreateTenant(ctx, "", "sus")
			if err != nil {
				t.Fatal(err)
			}
			ref := putSecret(t, e, tn.ID, "tenant-secret")
			// The tenant's own work on a platform machine root joined to it.
			tnNode := joinIn(t, e, tn.ID, pki.RoleNode)
			cmd := commandRow(t, e, tn.ID, tnNode.NodeID(), "sent", map[string]string{"ref": ref})
			if _, err := e.Client.SetTenantState(ctx, tn.ID, "suspend"); err != nil {
				t.Fatal(err)
			}
			_, err = request(t, tnNode, &nodev1.SecretRequestBody{NodeId: tnNode.NodeID(), Ref: ref, CommandId: cmd})
			expectSecretRefused(t, e, err, "tenant-suspended")
		})
		t.Run("ciphertext moved to another reference", func(t *testing.T) {
			a := putSecret(t, e, "root", "moved-from")
			b := putSecret(t, e, "root", "moved-to")
			if _, err := db.ExecContext(ctx, `UPDATE secrets SET sealed = (SELECT sealed FROM secrets WHERE ref = $1) WHERE ref = $2`, a, b); err != nil {
				t.Fatal(err)
			}
			cmd := liveCommand(t, e, n.NodeID(), b)
			_, err := request(t, n, &nodev1.SecretRequestBody{NodeId: n.NodeID(), Ref: b, CommandId: cmd})
			expectSecretRefused(t, e, err, "seal-broken")
		})
		t.Run("revoked certificate", func(t *testing.T) {
			if _, err := e.CP.Nodes.Revoke(ctx, admin, n.NodeID(), "", "operator"); err != nil {
				t.Fatal(err)
			}
			// The revocation ends the session; the request then comes on a
			// connection of its own and is refused for the certificate.
			n.WaitDisconnected(t)
			_, err := request(t, n, &nodev1.SecretRequestBody{NodeId: n.NodeID(), Ref: f.ref, CommandId: f.command})
			expectSecretRefused(t, e, err, "certificate-revoked")
		})
	})
}

// TestSecretOnlyOnLiveSession: a copy of a node's files, used from its own
// connection while the node holds its session, gets no secret, and
// neither does the node's own key on a second connection or once the node
// has no session: the gateway answers a secret request only on the
// connection of the node's live session (not-on-live-session, each
// recorded), so a copy must say Hello first, which counts it as a second
// boot of the identity. The node on its session is answered.
func TestSecretOnlyOnLiveSession(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		f := newSecretFixture(t, db, pki.RoleNode)
		e, n := f.e, f.node
		body := func() *nodev1.SecretRequestBody {
			return &nodev1.SecretRequestBody{NodeId: n.NodeID(), Ref: f.ref, CommandId: f.command}
		}
		refused := func(want int) {
			t.Helper()
			got := 0
			for _, ev := range events(t, e, secrets.EventRefused) {
				if ev.Details["reason"] == gateway.ReasonSecretOffSession {
					got++
				}
			}
			if got != want {
				t.Fatalf("%d %s refusals recorded, want %d", got, gateway.ReasonSecretOffSession, want)
			}
		}
		clone := e.OpenNode(t, copyNodeDir(t, n.Dir), "clone-boot")
		_, err := request(t, clone, body())
		expectSecretRefused(t, e, err, gateway.ReasonSecretOffSession)
		refused(1)

		req, err := n.SignSecretRequest(body())
		if err != nil {
			t.Fatal(err)
		}
		own, err := n.Dial()
		if err != nil {
			t.Fatal(err)
		}
		_, err = nodev1.NewGatewayClient(own).Secret(context.Background(), req)
		own.Close()
		expectSecretRefused(t, e, err, gateway.ReasonSecretOffSession)
		refused(2)

		if _, err := request(t, n, body()); err != nil {
			t.Fatalf("the node on its session: %v", err)
		}
		n.Stop()
		n.WaitDisconnected(t)
		_, err = request(t, n, body())
		expectSecretRefused(t, e, err, gateway.ReasonSecretOffSession)
		refused(3)
	})
}

func TestSecretBrokerRefusesNodeTenant(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		f := newSecretFixture(t, db, pki.RoleNodeTenant)
		_, err := request(t, f.node, &nodev1.SecretRequestBody{NodeId: f.node.NodeID(), Ref: f.ref, CommandId: f.command})
		expectSecretRefused(t, f.e, err, "node-tenant")
	})
}

func TestSecretScopes(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		fleet, err := e.CP.Secrets.Put(ctx, admin, "root", "site-bmc", secrets.ScopeFleet, []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.CP.Secrets.Put(ctx, admin, "root", "site-bmc", secrets.ScopeTenant, []byte("y")); errs.CodeOf(err) != errs.InvalidState {
			t.Fatalf("tenant-scoped put over a fleet secret: %v, want INVALID_STATE", err)
		}
		if err := e.CP.Secrets.Delete(ctx, admin, fleet.Ref, secrets.ScopeTenant); errs.CodeOf(err) != errs.InvalidState {
			t.Fatalf("tenant-scoped delete of a fleet secret: %v, want INVALID_STATE", err)
		}
		tn, _ := e.Client.CreateTenant(ctx, "", "scoped")
		if _, err := e.CP.Secrets.Put(ctx, admin, tn.ID, "x", secrets.ScopeFleet, []byte("z")); errs.CodeOf(err) != errs.InvalidInput {
			t.Fatalf("fleet put outside root: %v, want INVALID_INPUT", err)
		}
		var audit string
		if err := db.QueryRowContext(ctx, `SELECT details FROM audit_events WHERE resource = $1`, fleet.Ref).Scan(&audit); err != nil || !bytes.Contains([]byte(audit), []byte(`"scope":"fleet"`)) {
			t.Fatalf("put audit row: %s %v", audit, err)
		}
	})
}
