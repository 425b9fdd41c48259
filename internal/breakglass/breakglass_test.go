package breakglass_test

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/breakglass"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sshca"
	"github.com/bettercompute/bettercompute/internal/sshca/sshdtest"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// pubLine is a fresh user key's authorized_keys line.
func pubLine(t *testing.T) (string, crypto.Signer) {
	t.Helper()
	s, priv := sshdtest.NewKey(t)
	return string(ssh.MarshalAuthorizedKey(s.PublicKey())), priv
}

// wantAPIError asserts err is the API's refusal with code and message.
func wantAPIError(t *testing.T, err error, code, msg string) *client.Error {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want %s %q", err, code, msg)
	}
	if ce.Code != code || ce.Message != msg {
		t.Fatalf("got %s %q, want %s %q", ce.Code, ce.Message, code, msg)
	}
	return ce
}

// TestIssueRefusals: a public key that is not an SSH public key, an
// account with shell or ssh-option characters, a validity over an hour,
// a node in another tenant (answered exactly as a missing node) and the
// 21st certificate of an identity in an hour (RATE_LIMITED with
// Retry-After) are each refused by code and message; nothing of a refused
// request is recorded.
func TestIssueRefusals(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		env := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		node := env.Nodes[0].NodeID()
		line, _ := pubLine(t)
		issue := func(c *client.Client, in breakglass.IssueIn) (breakglass.Issued, error) {
			var out breakglass.Issued
			err := c.Call(ctx, "nodes.issueSshCert", in, &out)
			return out, err
		}
		_, err := issue(env.Client, breakglass.IssueIn{NodeID: node, Account: "root", PublicKey: "not a key"})
		wantAPIError(t, err, "INVALID_INPUT", "ssh-key-malformed: not an SSH public key")
		for _, acc := range []string{"root;id", "-oProxyCommand=x", "a b", "$(id)", "root\n"} {
			_, err := issue(env.Client, breakglass.IssueIn{NodeID: node, Account: acc, PublicKey: line})
			wantAPIError(t, err, "INVALID_INPUT", "ssh-account-invalid: account must match ^[a-z_][a-z0-9_-]{0,31}$")
		}
		_, err = issue(env.Client, breakglass.IssueIn{NodeID: node, Account: "root", PublicKey: line, ValiditySeconds: 3601})
		// The envelope's input bound refuses it first (the module checks
		// again for callers that are not the API: TestNotAfter).
		wantAPIError(t, err, "INVALID_INPUT", `field "validity_seconds": an integer from 0 to 3600`)

		// Another tenant's admin: the node answers exactly as a missing one.
		_, other := env.TenantAdmin(t, "other")
		const ghost = "nzzzzzzzzzzzzzzzz" // a node id that does not exist
		_, errMissing := issue(other, breakglass.IssueIn{NodeID: ghost, Account: "root", PublicKey: line})
		var missing *client.Error
		if !errors.As(errMissing, &missing) || missing.Code != "ACCESS_DENIED" {
			t.Fatalf("a missing node: %v", errMissing)
		}
		_, err = issue(other, breakglass.IssueIn{NodeID: node, Account: "root", PublicKey: line})
		foreign := wantAPIError(t, err, missing.Code, strings.ReplaceAll(missing.Message, ghost, node))
		if foreign.Status != missing.Status {
			t.Fatalf("another tenant's node: status %d, a missing node %d", foreign.Status, missing.Status)
		}
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM ssh_certs`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("refused requests recorded %d certificates (%v)", n, err)
		}

		// 20 an hour per identity, then RATE_LIMITED with Retry-After.
		// A fresh identity: the refused calls above spent tokens of the
		// admin's (the limit is taken once a call is decided).
		c := env.IdentityClient(t, "root", "ssh-rate", "admin")
		c.Retry = client.Retry{MaxTries: 1}
		for i := range breakglass.RateLimit {
			got, err := issue(c, breakglass.IssueIn{NodeID: node, Account: "root", PublicKey: line})
			if err != nil {
				t.Fatalf("certificate %d: %v", i+1, err)
			}
			if got.CommandID != "" { // the first: the node's state, finished before the node stops
				env.WaitCommand(t, got.CommandID)
			}
		}
		_, err = issue(c, breakglass.IssueIn{NodeID: node, Account: "root", PublicKey: line})
		ce := wantAPIError(t, err, "RATE_LIMITED", "ssh-rate-limited: at most 20 certificates an hour per identity")
		if ce.RetryAfter < time.Second || ce.RetryAfter > time.Hour {
			t.Fatalf("Retry-After %v", ce.RetryAfter)
		}
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM ssh_certs`).Scan(&n); err != nil || n != breakglass.RateLimit {
			t.Fatalf("%d certificates recorded, want %d (%v)", n, breakglass.RateLimit, err)
		}
		// Each recorded serial has its audit row: the serial and the key's
		// fingerprint, never the key or the certificate.
		rows, err := db.QueryContext(ctx, `SELECT c.serial, c.key_fingerprint, a.details FROM ssh_certs c JOIN audit_events a
			ON a.action = 'compute:nodes:ssh-root' AND a.resource = 'node/' || c.node_id AND a.outcome = 'allowed' AND a.details LIKE '%"serial":"' || CAST(c.serial AS TEXT) || '"%'`)
		if err != nil {
			t.Fatal(err)
		}
		audited := 0
		for rows.Next() {
			var serial int64
			var fp, details string
			if err := rows.Scan(&serial, &fp, &details); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(details, fp) || strings.Contains(details, strings.Fields(line)[1]) {
				t.Fatalf("audit details %s: want the fingerprint %s and never the key", details, fp)
			}
			audited++
		}
		rows.Close()
		if audited != breakglass.RateLimit {
			t.Fatalf("%d certificates audited, want %d", audited, breakglass.RateLimit)
		}
	})
}

// TestBreakGlassEndToEnd: a certificate issued through the API reaches
// the node as ssh.access, bcd writes the sshd files, and the real sshd
// with those files lets the real ssh log in with it; ssh-keygen -L shows
// at most 1 h, the principal <account>@<node> and only permit-pty. sshd
// refuses an expired certificate and one for another node's principal;
// after nodes.revokeSshCert the node's new KRL makes sshd refuse the
// certificate that logged in, and ssh-keygen -Q on nodes.sshKrl's KRL says
// REVOKED. A stale ssh.access generation is refused on bcd by its reason.
func TestBreakGlassEndToEnd(t *testing.T) {
	sshdtest.Require(t)
	me, err := user.Current()
	if err != nil || !sshca.ValidAccount(me.Username) {
		t.Fatalf("current account %v is not a valid account (%v)", me, err)
	}
	account := me.Username
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		base := sshdtest.StrictModesBase(t)
		work := filepath.Join(base, "work")
		if err := os.Mkdir(work, 0o700); err != nil {
			t.Fatal(err)
		}
		env := testenv.Start(t, db, testenv.Options{Nodes: 2, SSHDRoot: filepath.Join(base, "sshd")})
		ctx := context.Background()
		n1, n2 := env.Nodes[0], env.Nodes[1]
		issue := func(node string) (breakglass.Issued, crypto.Signer) {
			t.Helper()
			s, priv := sshdtest.NewKey(t)
			var out breakglass.Issued
			if err := env.Client.Call(ctx, "nodes.issueSshCert", breakglass.IssueIn{NodeID: node, Account: account,
				PublicKey: string(ssh.MarshalAuthorizedKey(s.PublicKey()))}, &out); err != nil {
				t.Fatal(err)
			}
			return out, priv
		}
		waitCommand := func(id string, want wire.State) string {
			t.Helper()
			if id == "" {
				t.Fatal("no ssh.access command queued")
			}
			c := env.WaitCommand(t, id)
			if c.State != want {
				t.Fatalf("ssh.access %s: %s %q, want %s", id, c.State, c.Reason, want)
			}
			return c.Reason
		}

		good, goodPriv := issue(n1.NodeID())
		waitCommand(good.CommandID, wire.StateSucceeded)
		s := sshdtest.Start(t, work, n1.SSH.Dir)
		if code, out := s.Login(t, account, "good", goodPriv, []byte(good.Certificate+"\n")); code != 0 {
			t.Fatalf("the issued certificate: exit %d, want 0\n%s", code, out)
		}

		// ssh-keygen -L: validity at most 1 h, the one principal, permit-pty only.
		certFile := filepath.Join(work, "good-cert.pub")
		out, code := sshdtest.Keygen(t, "-L", "-f", certFile)
		if code != 0 {
			t.Fatalf("ssh-keygen -L: %d\n%s", code, out)
		}
		m := regexp.MustCompile(`Valid: from (\S+) to (\S+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("ssh-keygen -L shows no validity:\n%s", out)
		}
		from, err1 := time.Parse("2006-01-02T15:04:05", m[1])
		to, err2 := time.Parse("2006-01-02T15:04:05", m[2])
		if err1 != nil || err2 != nil || to.Sub(from) > time.Hour || to.Sub(from) <= 0 {
			t.Fatalf("validity %s to %s (%v %v)", m[1], m[2], err1, err2)
		}
		principals := "Principals: \n                " + account + "@" + n1.NodeID() + "\n        Critical Options: (none)\n        Extensions: \n                permit-pty\n"
		if !strings.Contains(out, principals) {
			t.Fatalf("ssh-keygen -L, want principal %s@%s, no critical options, only permit-pty:\n%s", account, n1.NodeID(), out)
		}

		refused := func(name string, priv crypto.Signer, cert, reason string) {
			t.Helper()
			off := s.Log.Len()
			if code, out := s.Login(t, account, name, priv, []byte(cert+"\n")); code == 0 {
				t.Fatalf("%s: logged in, want refused\n%s", name, out)
			}
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			for _, want := range []string{reason, "Failed publickey for " + account + " from 127.0.0.1"} {
				if !s.Log.WaitFor(cctx, off, want) {
					t.Fatalf("%s: sshd did not log %q:\n%s", name, want, s.Log.String()[off:])
				}
			}
		}
		// Another node's principal, from the same CA.
		other, otherPriv := issue(n2.NodeID())
		refused("other-node", otherPriv, other.Certificate, "Certificate does not contain an authorized principal")
		// An expired certificate from the same CA.
		caKey, err := env.Bundle.BreakGlassCAKey(env.KEK)
		if err != nil {
			t.Fatal(err)
		}
		ca, _ := ssh.NewSignerFromKey(caKey)
		us, upriv := sshdtest.NewKey(t)
		old := time.Now().Add(-3 * time.Hour)
		expired, err := sshca.Issue(ca, sshca.Request{PublicKey: ssh.MarshalAuthorizedKey(us.PublicKey()), Account: account, NodeID: n1.NodeID(), Serial: 7, NotAfter: old.Add(time.Hour)}, old)
		if err != nil {
			t.Fatal(err)
		}
		refused("expired", upriv, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(expired))), "Certificate invalid: expired")

		// Revoke the certificate that logged in: the node's new KRL refuses it.
		var rv breakglass.Revoked
		if err := env.Client.Call(ctx, "nodes.revokeSshCert", breakglass.RevokeIn{NodeID: n1.NodeID(), Serial: good.Serial}, &rv); err != nil {
			t.Fatal(err)
		}
		waitCommand(rv.CommandID, wire.StateSucceeded)
		refused("revoked", goodPriv, good.Certificate, "revoked by file "+filepath.Join(n1.SSH.Dir, sshca.KRLFile))

		// nodes.sshKrl: the KRL as the node has it; ssh-keygen -Q says REVOKED.
		var krl breakglass.KRLOut
		if err := env.Client.Call(ctx, "nodes.sshKrl", breakglass.KRLIn{NodeID: n1.NodeID()}, &krl); err != nil {
			t.Fatal(err)
		}
		onNode, err := os.ReadFile(filepath.Join(n1.SSH.Dir, sshca.KRLFile))
		if err != nil || string(onNode) != string(krl.KRL) || krl.CommandID != rv.CommandID {
			t.Fatalf("nodes.sshKrl is not the node's KRL (%v, command %s want %s)", err, krl.CommandID, rv.CommandID)
		}
		krlFile := filepath.Join(work, "node.krl")
		if err := os.WriteFile(krlFile, krl.KRL, 0o600); err != nil {
			t.Fatal(err)
		}
		out, code = sshdtest.Keygen(t, "-Q", "-f", krlFile, certFile)
		if code != 1 || !strings.HasPrefix(out, certFile) || !strings.HasSuffix(out, ": REVOKED\n") {
			t.Fatalf("ssh-keygen -Q on nodes.sshKrl's KRL: exit %d\n%s", code, out)
		}

		// A stale generation (1, after the node applied 2) is refused on bcd.
		gen, err := n1.SSH.Generation()
		if err != nil || gen != krl.Generation || gen < 2 {
			t.Fatalf("node generation %d (%v), KRL's %d", gen, err, krl.Generation)
		}
		stale, err := sshca.Access{Generation: gen - 1, NodeID: n1.NodeID(), CA: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(ca.PublicKey()))),
			Accounts: []string{account}, IssuedAt: time.Now().Unix()}.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		c, err := env.CP.Commands.CreateOwned(ctx, kinds.ModuleBreakGlass, audit.Entry{TenantID: iam.RootTenant, Actor: "test"}, n1.NodeID(), kinds.SSHAccess, stale, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("ssh-access-stale-generation: generation %d is older than the applied %d", gen-1, gen)
		if reason := waitCommand(c.ID, wire.StateFailed); reason != want {
			t.Fatalf("stale state: reason %q, want %q", reason, want)
		}
		refused("revoked-after-stale", goodPriv, good.Certificate, "revoked by file")
	})
}
