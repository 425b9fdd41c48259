package api

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
)

// A private JWK never passes, even when one is put into the document.
func TestWellKnownRefusesPrivateKey(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	w := WellKnown{TrustDomain: "td", Keys: jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: pub, KeyID: "ok"}}}}
	if _, err := w.Marshal(); err != nil {
		t.Fatalf("public document refused: %v", err)
	}
	w.extra = []jose.JSONWebKey{{Key: priv, KeyID: "leak"}}
	if _, err := w.Marshal(); err == nil {
		t.Fatal("a private key was marshalled into the well-known document")
	}
}
