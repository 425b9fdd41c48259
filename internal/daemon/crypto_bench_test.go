package daemon

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"testing"
)

// BenchmarkCommandSignatures measures the signature work one command costs
// end to end, whoever does it: the worker signs the body (Ed25519), the
// node verifies it (Ed25519) and signs its update (ECDSA P-256), the
// gateway verifies the update (ECDSA P-256). docs/performance.md uses it to
// bound what a fan-out can cost on one machine that also runs every node.
func BenchmarkCommandSignatures(b *testing.B) {
	body := make([]byte, 200)
	_, wk, _ := ed25519.GenerateKey(rand.Reader)
	sig := ed25519.Sign(wk, body)
	nk, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	digest := sha256.Sum256(body)
	usig, _ := ecdsa.SignASN1(rand.Reader, nk, digest[:])
	b.Run("worker-ed25519-sign", func(b *testing.B) {
		for b.Loop() {
			ed25519.Sign(wk, body)
		}
	})
	b.Run("node-ed25519-verify", func(b *testing.B) {
		pub := wk.Public().(ed25519.PublicKey)
		for b.Loop() {
			if !ed25519.Verify(pub, body, sig) {
				b.Fatal("verify")
			}
		}
	})
	b.Run("node-p256-sign", func(b *testing.B) {
		for b.Loop() {
			if _, err := ecdsa.SignASN1(rand.Reader, nk, digest[:]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gateway-p256-verify", func(b *testing.B) {
		for b.Loop() {
			if !ecdsa.VerifyASN1(&nk.PublicKey, digest[:], usig) {
				b.Fatal("verify")
			}
		}
	})
}
