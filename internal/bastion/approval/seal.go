package approval

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"

	"golang.org/x/crypto/hkdf"
)

// nonceSize is the AES-GCM nonce length that leads every sealed blob.
const nonceSize = 12

// DeriveKey returns the 32-byte key HKDF-SHA256 derives from secret (the
// input key material) with no salt and info = purpose. Each file kind has
// its own purpose, so a blob sealed for one never opens as another.
func DeriveKey(secret []byte, purpose string) [32]byte {
	var k [32]byte
	r := hkdf.New(sha256.New, secret, nil, []byte(purpose))
	if _, err := io.ReadFull(r, k[:]); err != nil {
		// HKDF-SHA256 yields up to 8160 bytes; 32 cannot fail.
		panic("approval: hkdf: " + err.Error())
	}
	return k
}

// Seal encrypts plaintext with AES-256-GCM under key, binding aad, and
// returns a random 12-byte nonce followed by the ciphertext and tag.
func Seal(key [32]byte, aad, plaintext []byte) ([]byte, error) {
	g, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	out := make([]byte, nonceSize, nonceSize+len(plaintext)+g.Overhead())
	if _, err := rand.Read(out); err != nil {
		return nil, fmt.Errorf("approval: seal nonce: %w", err)
	}
	return g.Seal(out, out, plaintext, aad), nil
}

// Open reverses Seal. Bytes that are too short, or that do not
// authenticate under key and aad, are a *RefusedError ReasonSealBroken.
func Open(key [32]byte, aad, sealed []byte) ([]byte, error) {
	g, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	if len(sealed) < nonceSize+g.Overhead() {
		return nil, refuse(ReasonSealBroken, "sealed bytes too short")
	}
	pt, err := g.Open(nil, sealed[:nonceSize], sealed[nonceSize:], aad)
	if err != nil {
		return nil, refuse(ReasonSealBroken, "sealed bytes do not open")
	}
	return pt, nil
}

// newGCM returns AES-256-GCM under key.
func newGCM(key [32]byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key[:])
	if err != nil {
		return nil, fmt.Errorf("approval: aes: %w", err)
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		return nil, fmt.Errorf("approval: gcm: %w", err)
	}
	return g, nil
}
