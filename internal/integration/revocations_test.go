package integration

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"database/sql"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/breakglass"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/sshaccess"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/revocations"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/sshca"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestRevocationFeedClosesTunnels: revoking the API key a tunnel was
// opened with, or deleting its caller's identity, closes the open tunnel
// through the revocation feed, with ACCESS_DENIED naming the revoked
// credential. The environment's clock is fake and never advanced, so the
// tunnel's own 2-second re-decision never runs: only the feed can close
// it.
func TestRevocationFeedClosesTunnels(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		port := echoServer(t)
		e := testenv.Start(t, db, testenv.Options{Clock: clock.NewFake(time.Now()), NodeTune: func(c *daemon.Config) { c.TunnelPorts = []uint32{port} }})
		ctx := context.Background()
		for _, c := range []struct {
			name   string
			revoke func(tc tunnelCaller) error
		}{
			{"api key revoked", func(tc tunnelCaller) error {
				return e.Client.Call(ctx, "apiKeys.revoke", apitypes.IDIn{ID: tc.keyID}, nil)
			}},
			{"identity deleted", func(tc tunnelCaller) error {
				return e.Client.Call(ctx, "identities.delete", map[string]any{"tenant_id": tc.tenant, "id": tc.identity}, nil)
			}},
		} {
			t.Run(c.name, func(t *testing.T) {
				tc := newTunnelCaller(t, e, "fd"+c.name[:3])
				tun, err := tc.c.OpenTunnel(ctx, tc.node.NodeID(), int(port))
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				defer tun.Close()
				echoOnce(t, tun, "before")
				if err := c.revoke(tc); err != nil {
					t.Fatalf("revoke: %v", err)
				}
				// Left open, the client's own close ends the read with
				// another error, which fails the test instead of hanging.
				defer time.AfterFunc(20*time.Second, func() { tun.Close() }).Stop()
				_, err = io.ReadAll(tun)
				wantAPIError(t, err, "ACCESS_DENIED", "the caller's credential or identity was revoked")
			})
		}
	})
}

// revocationsSeen returns a channel told of each entry the node takes
// ("<kind>") or refuses ("refused <reason>").
func revocationsSeen(n *testenv.Node) <-chan string {
	ch := make(chan string, 64)
	n.OnRevocation(func(kind, reason string) {
		if reason != "" {
			ch <- "refused " + reason
		} else {
			ch <- kind
		}
	})
	return ch
}

func next(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(testenv.WaitTimeout):
		t.Fatal("the node got no revocation")
		return ""
	}
}

// appendSigned appends e to the feed and, in the same transaction, stores
// s as its signature (as a compromised database could), then pokes the
// gateways.
func appendSigned(t *testing.T, env *testenv.Env, e revwire.Entry, s *nodev1.SignedRevocation) {
	t.Helper()
	ctx := context.Background()
	err := env.CP.DB.Tx(ctx, func(tx *sql.Tx) error {
		if err := revocations.AppendTx(ctx, tx, e); err != nil {
			return err
		}
		if s == nil {
			return nil
		}
		_, err := tx.ExecContext(ctx, `UPDATE revocations SET body = $1, signature = $2, signer_cert = $3 WHERE seq = (SELECT MAX(seq) FROM revocations)`,
			s.Body, s.Signature, s.SignerCertDer)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	env.CP.Bus.Publish(bus.TopicRevoked)
	env.CP.Bus.Publish(bus.TopicRevocationsSigned)
}

// issueSSH issues a certificate for root on node and waits for the node
// to apply the state that lets it in; it returns the serial.
func issueSSH(t *testing.T, e *testenv.Env, node string) string {
	t.Helper()
	var out breakglass.Issued
	if err := e.Client.Call(context.Background(), "nodes.issueSshCert", breakglass.IssueIn{NodeID: node, Account: "root", PublicKey: sshPublicKey(t)}, &out); err != nil {
		t.Fatal(err)
	}
	if out.CommandID != "" {
		if c := e.WaitCommand(t, out.CommandID); c.State != "succeeded" {
			t.Fatalf("ssh.access: %s %s", c.State, c.Result)
		}
	}
	return out.Serial
}

func sshPublicKey(t *testing.T) string {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return string(ssh.MarshalAuthorizedKey(s.PublicKey()))
}

// krlOnDisk checks that the node's KRL file is exactly the applied state's
// KRL with serials, and returns the serials it revokes.
func krlOnDisk(t *testing.T, n *testenv.Node) []uint64 {
	t.Helper()
	serials, err := n.SSH.KRLSerials()
	if err != nil {
		t.Fatal(err)
	}
	state, err := os.ReadFile(filepath.Join(n.Dir, sshaccess.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	a, ca, err := sshca.DecodeAccess(state)
	if err != nil {
		t.Fatal(err)
	}
	k := a.KRL(ca)
	k.Serials = serials
	want, err := k.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(n.SSH.Dir, sshca.KRLFile))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the KRL file is not the state's KRL with serials %v (%v)", serials, err)
	}
	return serials
}

// TestRevokedSSHSerialReachesKRLOverSession: a signed ssh-cert entry of
// the feed reaches its node over the session and its serial is in the
// node's KRL file at once, with no ssh.access command (none is queued,
// the applied generation stays), and stays there until the state of its
// generation is applied. nodes.revokeSshCert appends such an entry,
// naming the generation of the state it queues.
func TestRevokedSSHSerialReachesKRLOverSession(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		n := e.Nodes[0]
		node := n.NodeID()
		serial := issueSSH(t, e, node)
		gen, err := n.SSH.Generation()
		if err != nil || gen == 0 {
			t.Fatalf("generation %d (%v) after the issue", gen, err)
		}
		before, err := e.Client.Commands(ctx, client.CommandListIn{NodeID: node})
		if err != nil {
			t.Fatal(err)
		}
		seen := revocationsSeen(n)
		const ahead = 424242
		appendSigned(t, e, revwire.Entry{Kind: revwire.KindSSHCert, Subject: strconv.Itoa(ahead), TenantID: "root", NodeID: node,
			At: time.Now(), Reason: "test", Generation: gen + 5}, nil)
		if got := next(t, seen); got != revwire.KindSSHCert {
			t.Fatalf("node: %s, want the ssh-cert entry taken", got)
		}
		if krl := krlOnDisk(t, n); !slices.Contains(krl, ahead) {
			t.Fatalf("KRL %v lacks the serial the feed revoked", krl)
		}
		after, err := e.Client.Commands(ctx, client.CommandListIn{NodeID: node})
		if g, _ := n.SSH.Generation(); err != nil || len(after) != len(before) || g != gen {
			t.Fatalf("commands %d -> %d (%v), generation %d -> %d: the serial came by a command", len(before), len(after), err, gen, g)
		}

		// The module's revocation appends the entry with its generation.
		head, err := e.CP.Revocations.Head(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Client.Call(ctx, "nodes.revokeSshCert", breakglass.RevokeIn{NodeID: node, Serial: serial}, nil); err != nil {
			t.Fatal(err)
		}
		entries, err := e.CP.Revocations.Since(ctx, head, 10)
		if err != nil || len(entries) != 1 {
			t.Fatalf("entries after revokeSshCert: %v (%v)", entries, err)
		}
		if x := entries[0]; x.Kind != revwire.KindSSHCert || x.Subject != serial || x.NodeID != node || x.Generation != gen+1 || x.TenantID != "root" {
			t.Fatalf("entry %+v, want ssh-cert %s of %s at generation %d", x, serial, node, gen+1)
		}
	})
}

// TestNodeRefusesForgedRevocations: entries a compromised database or
// gateway could put in the feed reach bcd and are refused by their exact
// reasons, changing nothing: one signed by a worker key of another
// deployment's command root, one whose body was changed after signing,
// one signed under the command context, and a genuine one naming another
// node. A genuine entry for the node is then taken.
func TestNodeRefusesForgedRevocations(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		n := e.Nodes[0]
		node := n.NodeID()
		issueSSH(t, e, node)
		seen := revocationsSeen(n)
		b := e.Bundle
		entry := func(serial int) revwire.Entry {
			return revwire.Entry{Kind: revwire.KindSSHCert, Subject: strconv.Itoa(serial), TenantID: "root", NodeID: node, At: time.Now(), Reason: "test", Generation: 1000}
		}
		body := func(en revwire.Entry) []byte {
			en.Seq = 1
			raw, err := revwire.Marshal(revwire.Body(en, b.Deployment, b.TrustDomain))
			if err != nil {
				t.Fatal(err)
			}
			return raw
		}
		genuine := func(en revwire.Entry) *nodev1.SignedRevocation {
			en.Seq = 1
			s, err := e.CP.Signer.SignRevocation(ctx, revwire.Body(en, b.Deployment, b.TrustDomain))
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		// Another deployment's command root certifies a worker key.
		foreignRoot, foreignKey := foreignCommandRoot(t)
		fpub, fpriv, _ := ed25519.GenerateKey(nil)
		fcert, err := pki.IssueWorkerCert(foreignRoot, foreignKey, b.TrustDomain, "wk-foreign", fpub, time.Hour, time.Now().Add(-time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		raw := body(entry(1001))
		foreign := &nodev1.SignedRevocation{Body: raw, Signature: ed25519.Sign(fpriv, append([]byte(revwire.SigContext), raw...)), SignerCertDer: fcert}
		tampered := genuine(entry(1002))
		tampered.Body = body(entry(1003))
		cmdSig := e.WorkerSigner(t)
		sig, cert := cmdSig(body(entry(1004)))
		otherNode := entry(1005)
		otherNode.NodeID = "n_othernode"
		for _, c := range []struct {
			s    *nodev1.SignedRevocation
			want revwire.Reason
		}{
			{foreign, revwire.ReasonSignerUntrusted},
			{tampered, revwire.ReasonSignatureInvalid},
			{&nodev1.SignedRevocation{Body: body(entry(1004)), Signature: sig, SignerCertDer: cert}, revwire.ReasonSignatureInvalid},
			{genuine(otherNode), revwire.ReasonOtherNode},
		} {
			appendSigned(t, e, entry(1999), c.s)
			if got := next(t, seen); got != "refused "+string(c.want) {
				t.Fatalf("node: %s, want refused %s", got, c.want)
			}
		}
		for _, s := range krlOnDisk(t, n) {
			if s > 1000 && s < 2000 {
				t.Fatalf("a refused entry's serial %d is in the KRL", s)
			}
		}
		appendSigned(t, e, entry(1006), genuine(entry(1006)))
		if got := next(t, seen); got != revwire.KindSSHCert {
			t.Fatalf("node: %s, want the genuine entry taken", got)
		}
		if krl := krlOnDisk(t, n); !slices.Contains(krl, 1006) {
			t.Fatalf("KRL %v lacks the genuine entry's serial", krl)
		}
	})
}

// foreignCommandRoot is another deployment's command-signing root (same
// trust domain name) and its key.
func foreignCommandRoot(t *testing.T) (*x509.Certificate, ed25519.PrivateKey) {
	t.Helper()
	dir := t.TempDir()
	kek, err := pki.CreateKEK(filepath.Join(dir, "kek"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := pki.Init(filepath.Join(dir, "pki"), "test.bc.local", kek, clock.NewFake(time.Now().Add(-48*time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	k, err := b.CommandRootKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	return b.CommandRoot, k
}

// TestNodeRevocationAppendsInItsTransaction: nodes.revoke appends one
// node-cert entry per certificate it revoked (serial, node, tenant,
// reason) in its own transaction: when the append fails the certificate
// is not revoked and the node stays connected.
func TestNodeRevocationAppendsInItsTransaction(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		n := e.Nodes[0]
		head, err := e.CP.Revocations.Head(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A row at the next number, not taken: the revocation's append
		// collides and its transaction rolls back.
		if _, err := db.ExecContext(ctx, `INSERT INTO revocations (seq, kind, subject, tenant_id, node_id, at, reason) VALUES ($1, 'api-key', 'planted', 'root', '', 0, 'test')`, head+1); err != nil {
			t.Fatal(err)
		}
		if err := e.Client.Call(ctx, "nodes.revoke", apitypes.NodeRevokeIn{NodeID: n.NodeID()}, nil); err == nil {
			t.Fatal("nodes.revoke committed although its feed entry could not be appended")
		}
		if st, err := e.CP.Nodes.CertState(ctx, n.Serial()); err != nil || st.Revoked {
			t.Fatalf("certificate revoked %v (%v) by a revocation whose append failed", st.Revoked, err)
		}
		if _, err := db.ExecContext(ctx, `DELETE FROM revocations WHERE subject = 'planted'`); err != nil {
			t.Fatal(err)
		}
		if err := e.Client.Call(ctx, "nodes.revoke", apitypes.NodeRevokeIn{NodeID: n.NodeID()}, nil); err != nil {
			t.Fatal(err)
		}
		entries, err := e.CP.Revocations.Since(ctx, head, 10)
		if err != nil || len(entries) != 1 {
			t.Fatalf("entries after nodes.revoke: %v (%v)", entries, err)
		}
		if x := entries[0]; x.Kind != revwire.KindNodeCert || x.Subject != n.Serial() || x.NodeID != n.NodeID() || x.TenantID != "root" || x.Reason != "operator" {
			t.Fatalf("entry %+v, want node-cert %s of %s", x, n.Serial(), n.NodeID())
		}
		n.WaitDisconnected(t)
	})
}

// TestRevocationsListScoped: revocations.list shows the root tenant every
// entry of the feed and another tenant only its own, in feed order, with
// the entries after --since only.
func TestRevocationsListScoped(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		ta, adminA := e.TenantAdmin(t, "lista")
		tb, _ := e.TenantAdmin(t, "listb")
		revokeOne := func(tenant string) string {
			id, err := e.Client.CreateIdentity(ctx, tenant, "spare-"+tenant, "person")
			if err != nil {
				t.Fatal(err)
			}
			k, err := e.Client.CreateAPIKey(ctx, tenant, id.ID, "spare", 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Client.Call(ctx, "apiKeys.revoke", apitypes.IDIn{ID: k.ID}, nil); err != nil {
				t.Fatal(err)
			}
			return k.ID
		}
		keyA, keyB := revokeOne(ta), revokeOne(tb)
		list := func(c *client.Client, since int64) []apitypes.Revocation {
			var out struct {
				Revocations []apitypes.Revocation `json:"revocations"`
			}
			if err := c.Call(ctx, "revocations.list", apitypes.RevocationsListIn{Since: since}, &out); err != nil {
				t.Fatal(err)
			}
			return out.Revocations
		}
		subjects := func(rs []apitypes.Revocation) []string {
			var s []string
			for _, r := range rs {
				s = append(s, r.TenantID+"/"+r.Subject)
			}
			return s
		}
		if got := subjects(list(adminA, 0)); !slices.Equal(got, []string{ta + "/" + keyA}) {
			t.Fatalf("tenant A lists %v, want only its own key", got)
		}
		all := list(e.Client, 0)
		if got := subjects(all); !slices.Equal(got, []string{ta + "/" + keyA, tb + "/" + keyB}) {
			t.Fatalf("root lists %v, want both tenants' keys in order", got)
		}
		if got := subjects(list(e.Client, all[0].Seq)); !slices.Equal(got, []string{tb + "/" + keyB}) {
			t.Fatalf("root lists %v after %d", got, all[0].Seq)
		}
	})
}
