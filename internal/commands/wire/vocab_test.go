package wire

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"testing"
)

func TestStateTerminal(t *testing.T) {
	for _, tc := range []struct {
		s        State
		terminal bool
		valid    bool
	}{
		{StateQueued, false, true}, {StateSent, false, true}, {StateRunning, false, true},
		{StateSucceeded, true, true}, {StateFailed, true, true}, {StateCancelled, true, true},
		{"", false, false}, {"done", false, false}, {"Succeeded", false, false},
	} {
		if got := tc.s.Terminal(); got != tc.terminal {
			t.Errorf("%q.Terminal() = %v, want %v", tc.s, got, tc.terminal)
		}
		if got := tc.s.Valid(); got != tc.valid {
			t.Errorf("%q.Valid() = %v, want %v", tc.s, got, tc.valid)
		}
	}
}

func TestNodeSignatureBindsKeyContextAndBody(t *testing.T) {
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	body := []byte("body")
	for name, key := range map[string]crypto.Signer{"ecdsa": ec, "ed25519": ed} {
		sig, err := SignNode(key, UpdateSigContext, body)
		if err != nil {
			t.Fatalf("%s: sign: %v", name, err)
		}
		if !VerifyNode(key.Public(), UpdateSigContext, body, sig) {
			t.Fatalf("%s: own signature does not verify", name)
		}
		if VerifyNode(key.Public(), SandboxReportSigContext, body, sig) {
			t.Errorf("%s: signature verified under another context", name)
		}
		if VerifyNode(key.Public(), UpdateSigContext, []byte("bodY"), sig) {
			t.Errorf("%s: signature verified over another body", name)
		}
		if VerifyNode(other.Public(), UpdateSigContext, body, sig) {
			t.Errorf("%s: signature verified under another key", name)
		}
	}
	r, _ := rsa.GenerateKey(rand.Reader, 1024)
	if _, err := SignNode(r, UpdateSigContext, body); err == nil {
		t.Error("SignNode accepted an RSA key")
	}
	if VerifyNode(&r.PublicKey, UpdateSigContext, body, []byte("x")) {
		t.Error("VerifyNode accepted an RSA key")
	}
}

func FuzzVerifyNode(f *testing.F) {
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	sig, _ := SignNode(ec, UpdateSigContext, []byte("seed"))
	f.Add([]byte("seed"), sig)
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, body, sig []byte) {
		ok := VerifyNode(ec.Public(), UpdateSigContext, body, sig)
		if ok && string(body) != "seed" {
			// A forgery over another body would be an ECDSA break.
			t.Fatalf("verified a signature over %q", body)
		}
	})
}
