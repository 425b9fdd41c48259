package integration

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/cli"
	"github.com/bettercompute/bettercompute/internal/commands/attestation"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// boundDiagRunUpdate is an update body for a diag.run command created with no
// payload ("{}"), bound to it as bcd binds its updates.
func boundDiagRunUpdate(id, state, result string) *nodev1.UpdateBody {
	sum := sha256.Sum256([]byte("{}"))
	return &nodev1.UpdateBody{CommandId: id, State: state, Result: []byte(result), Kind: "diag.run", PayloadSha256: sum[:]}
}

// TestAttestedResultBoundToCommand: the node's signed result names the
// command's kind and payload digest, and the control plane attests it only
// when both are the command row's: a result signed for other content (a
// row rewritten after signing, or a body moved from another command) is
// recorded but not attested.
func TestAttestedResultBoundToCommand(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		n := e.Nodes[0]

		// A real run: the signed body names kind and payload digest.
		payload := `{"suite":"quick"}`
		c, err := e.Client.CreateCommand(ctx, n.NodeID(), "diag.run", json.RawMessage(payload))
		if err != nil {
			t.Fatal(err)
		}
		got := e.WaitCommand(t, c.ID)
		if got.State != "succeeded" || !got.Attested {
			t.Fatalf("diag.run: %s attested=%v, want succeeded attested", got.State, got.Attested)
		}
		var stored []byte
		if err := db.QueryRowContext(ctx, `SELECT update_body FROM commands WHERE id = $1`, c.ID).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		var body nodev1.UpdateBody
		if err := proto.Unmarshal(stored, &body); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(got.Payload)
		if body.Kind != "diag.run" || !bytes.Equal(body.PayloadSha256, sum[:]) {
			t.Fatalf("signed body names kind %q payload %x, want diag.run %x", body.Kind, body.PayloadSha256, sum)
		}

		// Results signed by the node's own key for other content than the
		// row holds.
		n.Stop()
		other := sha256.Sum256([]byte(`{"suite":"other"}`))
		for name, b := range map[string]*nodev1.UpdateBody{
			"another kind":      {Kind: "node.ping", PayloadSha256: sum[:]},
			"another payload":   {Kind: "diag.run", PayloadSha256: other[:]},
			"no binding at all": {},
		} {
			t.Run(name, func(t *testing.T) {
				moved, err := e.CP.Commands.Create(ctx, admin, n.NodeID(), "diag.run", json.RawMessage(payload), time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				b.CommandId, b.State, b.Result = moved.ID, "succeeded", []byte(`{"ok":true}`)
				raw, err := n.SignUpdate(b)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := e.CP.Commands.ApplyUpdate(ctx, n.NodeID(), unmarshalUpdate(t, raw)); err != nil {
					t.Fatal(err)
				}
				got, err := e.CP.Commands.Get(ctx, iam.RootScope(), moved.ID)
				if err != nil {
					t.Fatal(err)
				}
				if got.State != "succeeded" || got.Attested {
					t.Fatalf("%s: %s attested=%v, want succeeded, not attested", name, got.State, got.Attested)
				}
				if _, err := e.Client.CommandAttestation(ctx, moved.ID); err == nil || admitAPIError(t, err).Code != "INVALID_STATE" {
					t.Fatalf("attestation of an unattested result: %v, want INVALID_STATE", err)
				}
			})
		}

		// The row rewritten after the node signed: the real result no
		// longer attests it.
		n2 := e.OpenNode(t, n.Dir, "")
		e.Nodes[0] = n2
		c2, err := e.CP.Commands.Create(ctx, admin, n2.NodeID(), "diag.run", json.RawMessage(payload), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		attestWaitSigned(t, e, c2.ID)
		if _, err := db.ExecContext(ctx, `UPDATE commands SET payload = $1 WHERE id = $2`, []byte(`{"suite":"other"}`), c2.ID); err != nil {
			t.Fatal(err)
		}
		n2.Start(t)
		if got := e.WaitCommand(t, c2.ID); got.State != "succeeded" || got.Attested {
			t.Fatalf("rewritten row: %s attested=%v, want succeeded, not attested", got.State, got.Attested)
		}
	})
}

// attestWaitSigned polls until the signing worker has signed command id.
func attestWaitSigned(t *testing.T, e *testenv.Env, id string) {
	t.Helper()
	deadline := time.Now().Add(testenv.WaitTimeout)
	for {
		var signed int
		if err := e.CP.DB.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM commands WHERE id = $1 AND body IS NOT NULL`, id).Scan(&signed); err != nil {
			t.Fatal(err)
		}
		if signed == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("command %s was never signed", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// attestOtherCA returns the DER of a fresh CA certificate no node chains to.
func attestOtherCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other node CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// attestRunCLI runs the better-compute CLI in process and returns its exit
// status, stdout and stderr.
func attestRunCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := cli.Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestVerifyAttestationOffline: `commands attestation ID --out F` writes a
// real attested result, and `commands verify-attestation F --ca CA` checks
// it with no server (the control plane is stopped first); one flipped byte
// anywhere it matters fails with exit 1 and the reason, as does another
// CA.
func TestVerifyAttestationOffline(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		n := e.Nodes[0]
		c, err := e.Client.CreateCommand(ctx, n.NodeID(), "diag.run", json.RawMessage(`{"suite":"quick"}`))
		if err != nil {
			t.Fatal(err)
		}
		if got := e.WaitCommand(t, c.ID); got.State != "succeeded" || !got.Attested {
			t.Fatalf("diag.run: %s attested=%v", got.State, got.Attested)
		}
		dir := t.TempDir()
		file := filepath.Join(dir, "att.pem")
		t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
		t.Setenv("BC_API_KEY", e.Client.Key())
		if code, out, errOut := attestRunCLI("commands", "attestation", c.ID, "--out", file); code != 0 {
			t.Fatalf("commands attestation: exit %d: %s %s", code, out, errOut)
		}
		ca := filepath.Join(dir, "node-ca.pem")
		if err := os.WriteFile(ca, pki.CertPEM(e.Bundle.NodeCA.Raw), 0o644); err != nil {
			t.Fatal(err)
		}
		e.Close() // no server from here on
		t.Setenv("BC_ADDR", "http://127.0.0.1:1")

		code, out, errOut := attestRunCLI("commands", "verify-attestation", file, "--ca", ca, "--json")
		if code != 0 {
			t.Fatalf("verify-attestation: exit %d: %s", code, errOut)
		}
		var r attestation.Result
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(`{"suite":"quick"}`))
		if r.CommandID != c.ID || r.Kind != "diag.run" || r.State != "succeeded" || r.NodeID != n.NodeID() ||
			r.PayloadSHA256 != hex.EncodeToString(sum[:]) || r.SPIFFEID != pki.NodeSPIFFEID(e.Bundle.TrustDomain, n.NodeID()).String() {
			t.Fatalf("verified result: %+v", r)
		}
		if code, out, _ := attestRunCLI("commands", "verify-attestation", file, "--ca", ca); code != 0 || !strings.Contains(out, "kind:           diag.run") {
			t.Fatalf("text output: exit %d: %s", code, out)
		}

		good, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		f, err := attestation.Parse(good)
		if err != nil {
			t.Fatal(err)
		}
		flip := func(b []byte, i int) []byte {
			b = bytes.Clone(b)
			b[i] ^= 1
			return b
		}
		for name, tc := range map[string]struct {
			body, sig []byte
			want      string
		}{
			"flipped byte in the signed update": {flip(f.Body, len(f.Body)-1), f.Signature, "the signature does not verify"},
			"flipped byte in the signature":     {f.Body, flip(f.Signature, len(f.Signature)-1), "the signature does not verify"},
		} {
			t.Run(name, func(t *testing.T) {
				bad := filepath.Join(dir, "bad.pem")
				var chain [][]byte
				for _, c := range f.Chain {
					chain = append(chain, c.Raw)
				}
				if err := os.WriteFile(bad, attestation.Encode(tc.body, tc.sig, chain), 0o644); err != nil {
					t.Fatal(err)
				}
				code, _, errOut := attestRunCLI("commands", "verify-attestation", bad, "--ca", ca)
				if code != 1 || !strings.Contains(errOut, "not verified: attestation: "+tc.want) {
					t.Fatalf("exit %d %q, want 1 and %q", code, errOut, tc.want)
				}
			})
		}
		t.Run("another CA", func(t *testing.T) {
			otherCA := filepath.Join(dir, "other-ca.pem")
			if err := os.WriteFile(otherCA, pki.CertPEM(attestOtherCA(t)), 0o644); err != nil {
				t.Fatal(err)
			}
			code, _, errOut := attestRunCLI("commands", "verify-attestation", file, "--ca", otherCA)
			if code != 1 || !strings.Contains(errOut, "not verified: attestation: node certificate") {
				t.Fatalf("exit %d %q, want 1 and a chain failure", code, errOut)
			}
		})
	})
}
