package nodes

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"testing"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/pki"
)

// TestVerifyRenewProof: only the current key's signature over this CSR
// under the renewal context passes; another key's, another CSR's, another
// context's (an update's) or none does not.
func TestVerifyRenewProof(t *testing.T) {
	key, _ := pki.NewNodeKey()
	other, _ := pki.NewNodeKey()
	csr, _ := pki.CSR(other, "n-1")
	csr2, _ := pki.CSR(key, "n-1")
	sign := func(k *ecdsa.PrivateKey, sigContext string, body []byte) []byte {
		d := sha256.Sum256(append([]byte(sigContext), body...))
		sig, err := ecdsa.SignASN1(rand.Reader, k, d[:])
		if err != nil {
			t.Fatal(err)
		}
		return sig
	}
	if !VerifyRenewProof(&key.PublicKey, csr, sign(key, wire.RenewSigContext, csr)) {
		t.Fatal("the current key's proof does not verify")
	}
	for name, proof := range map[string][]byte{
		"another key":    sign(other, wire.RenewSigContext, csr),
		"another CSR":    sign(key, wire.RenewSigContext, csr2),
		"update context": sign(key, wire.UpdateSigContext, csr),
		"none":           nil,
		"garbage":        []byte("not a signature"),
	} {
		if VerifyRenewProof(&key.PublicKey, csr, proof) {
			t.Errorf("%s: proof verified", name)
		}
	}
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	d := sha256.Sum256(append([]byte(wire.RenewSigContext), csr...))
	if !VerifyRenewProof(pub, csr, ed25519.Sign(priv, d[:])) {
		t.Fatal("an Ed25519 node key's proof does not verify")
	}
	if VerifyRenewProof(pub, csr2, ed25519.Sign(priv, d[:])) {
		t.Fatal("an Ed25519 proof verified for another CSR")
	}
}
