package wgtun

import (
	"crypto/ecdh"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
)

// KeyLen is the length of a WireGuard (Curve25519) key in bytes.
const KeyLen = 32

// Key is a Curve25519 WireGuard key, private or public. The same type serves
// both because configuration files and the control plane's database hold
// both in the same base64 form; the caller knows which one it has.
type Key [KeyLen]byte

// GenerateKey returns a new random private key, clamped as Curve25519
// requires (and as `wg genkey` writes it).
func GenerateKey() (Key, error) {
	var k Key
	if _, err := rand.Read(k[:]); err != nil {
		return Key{}, fmt.Errorf("wgtun: reading random key: %w", err)
	}
	k[0] &= 248
	k[31] = (k[31] & 127) | 64
	return k, nil
}

// Public returns the public key of private key k.
func (k Key) Public() Key {
	priv, err := ecdh.X25519().NewPrivateKey(k[:])
	if err != nil {
		// NewPrivateKey fails only on a wrong length, which the array type
		// rules out.
		panic("wgtun: X25519 private key of the wrong length")
	}
	var pub Key
	copy(pub[:], priv.PublicKey().Bytes())
	return pub
}

// IsZero reports whether k is all zeros (an unset key).
func (k Key) IsZero() bool {
	return k == Key{}
}

// String returns k in standard base64, the form configuration files and the
// control plane's database hold. Never log a private key: slog calls
// LogValue, which redacts; do not format a private key into a message.
func (k Key) String() string {
	return base64.StdEncoding.EncodeToString(k[:])
}

// LogValue makes slog record a key as a short fingerprint (the first 8 bytes
// of its SHA-256, hex) rather than the key itself, so a private key that
// reaches a log by mistake does not leak. Compute Fingerprint of a known
// public key to match it.
func (k Key) LogValue() slog.Value {
	return slog.StringValue(k.Fingerprint())
}

// Fingerprint is a short, one-way name for k ("sha256:" and 16 hex digits)
// that is safe to log for private and public keys alike.
func (k Key) Fingerprint() string {
	sum := sha256.Sum256(k[:])
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// hex returns k as lowercase hex, the form the device's configuration
// protocol (UAPI) takes.
func (k Key) hex() string {
	return hex.EncodeToString(k[:])
}

// ParseKey parses a key in standard base64 (44 characters with padding), the
// form String writes. Anything else is refused; the error never repeats the
// input, which may be a private key.
func ParseKey(s string) (Key, error) {
	if len(s) != base64.StdEncoding.EncodedLen(KeyLen) {
		return Key{}, fmt.Errorf("wgtun: key is %d characters, want %d", len(s), base64.StdEncoding.EncodedLen(KeyLen))
	}
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil || len(b) != KeyLen {
		return Key{}, fmt.Errorf("wgtun: key is not standard base64 of %d bytes", KeyLen)
	}
	var k Key
	copy(k[:], b)
	return k, nil
}
