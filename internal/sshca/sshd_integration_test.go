package sshca_test

import (
	"context"
	"crypto"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/sshca"
	"github.com/bettercompute/bettercompute/internal/sshca/sshdtest"
)

// TestSSHDEnforcesBreakGlassCertificates starts the real sshd with the
// files WriteSSHDFiles wrote for node n1 and the current account, and the
// real ssh client logs in with issued certificates: a valid one logs in
// (so the KRL, which revokes another serial, loads); sshd itself refuses a
// revoked serial, an expired certificate, a certificate for another node's
// principal, one for the right principal from another CA, and, after the
// KRL is rewritten, the serial that had logged in.
func TestSSHDEnforcesBreakGlassCertificates(t *testing.T) {
	sshdtest.Require(t)
	me, err := user.Current()
	if err != nil || !sshca.ValidAccount(me.Username) {
		t.Fatalf("current account %v is not a valid account (%v)", me, err)
	}
	account := me.Username

	base := sshdtest.StrictModesBase(t)
	filesDir := filepath.Join(base, "sshd-files")
	work := filepath.Join(base, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		t.Fatal(err)
	}
	ca, _ := sshdtest.NewKey(t)
	otherCA, _ := sshdtest.NewKey(t)
	const revokedSerial = 200
	files := sshca.Files{CA: ca.PublicKey(), NodeID: "n1", Accounts: []string{account}, KRL: sshca.KRL{Version: 1, Serials: []uint64{revokedSerial}, Generated: time.Now()}}
	if err := sshca.WriteSSHDFiles(filesDir, files); err != nil {
		t.Fatal(err)
	}
	s := sshdtest.Start(t, work, filesDir)

	now := time.Now()
	issue := func(signer ssh.Signer, serial uint64, node string, at time.Time) (crypto.Signer, *ssh.Certificate) {
		user, priv := sshdtest.NewKey(t)
		cert, err := sshca.Issue(signer, sshca.Request{
			PublicKey: ssh.MarshalAuthorizedKey(user.PublicKey()), Account: account, NodeID: node,
			Serial: serial, NotAfter: at.Add(24 * time.Hour),
		}, at)
		if err != nil {
			t.Fatal(err)
		}
		return priv, cert
	}
	// refused runs a login that must fail, and waits for sshd's own
	// verdict: its reason (when sshd logs one at VERBOSE) and the failed
	// publickey line naming this certificate's serial and CA, so that a
	// client-side error never passes for a refusal.
	refused := func(name string, priv crypto.Signer, cert *ssh.Certificate, reason string) {
		t.Helper()
		offset := s.Log.Len()
		code, out := s.Login(t, account, strings.ReplaceAll(name, " ", "-"), priv, ssh.MarshalAuthorizedKey(cert)) // the name is a file name
		if code == 0 {
			t.Errorf("%s: logged in, want refused\n%s", name, out)
			return
		}
		failed := fmt.Sprintf("Failed publickey for %s from 127.0.0.1", account)
		verdict := fmt.Sprintf("(serial %d) CA ED25519 %s", cert.Serial, ssh.FingerprintSHA256(cert.SignatureKey))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, want := range []string{reason, failed, verdict} {
			if !s.Log.WaitFor(ctx, offset, want) {
				t.Errorf("%s: refused (exit %d) but sshd did not log %q:\n%s\nssh said:\n%s", name, code, want, s.Log.String()[offset:], out)
				return
			}
		}
	}

	validPriv, valid := issue(ca, 100, "n1", now)
	if code, out := s.Login(t, account, "valid", validPriv, ssh.MarshalAuthorizedKey(valid)); code != 0 {
		t.Fatalf("valid certificate: exit %d, want 0\n%s", code, out)
	}
	priv, cert := issue(ca, revokedSerial, "n1", now)
	refused("revoked", priv, cert, "revoked by file "+filepath.Join(filesDir, sshca.KRLFile))
	priv, cert = issue(ca, 101, "n1", now.Add(-2*time.Hour))
	refused("expired", priv, cert, "Certificate invalid: expired")
	priv, cert = issue(ca, 102, "n2", now)
	refused("other node", priv, cert, "Certificate does not contain an authorized principal")
	priv, cert = issue(otherCA, 103, "n1", now)
	refused("other CA", priv, cert, "") // sshd names no reason at VERBOSE; the verdict line names the CA

	files.KRL = sshca.KRL{Version: 2, Serials: []uint64{revokedSerial, 100}, Generated: time.Now()}
	if err := sshca.WriteSSHDFiles(filesDir, files); err != nil {
		t.Fatal(err)
	}
	refused("revoked after login", validPriv, valid, "revoked by file "+filepath.Join(filesDir, sshca.KRLFile))
}
