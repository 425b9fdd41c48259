package previewtoken

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
)

// SeedSize is the length of a marshalled key (an Ed25519 seed).
const SeedSize = ed25519.SeedSize

// ErrBadSeed is returned by KeyFromSeed for a seed of the wrong length.
var ErrBadSeed = errors.New("previewtoken: a preview key seed is 32 bytes")

// ErrZeroKey is returned when a zero Key (not made by GenerateKey or
// KeyFromSeed) is used to issue or verify.
var ErrZeroKey = errors.New("previewtoken: zero preview key")

// Key is a preview signing key: an Ed25519 private key and its key id. Its
// private half never prints: String, Format, GoString and LogValue show
// only the key id, so a Key passed to fmt or slog by mistake leaks
// nothing. The zero Key is not usable.
type Key struct {
	priv ed25519.PrivateKey
	kid  string
}

// GenerateKey makes a new key from 32 bytes of rand (crypto/rand.Reader in
// production; nil means a secure source).
func GenerateKey(rand io.Reader) (Key, error) {
	_, priv, err := ed25519.GenerateKey(rand)
	if err != nil {
		return Key{}, fmt.Errorf("previewtoken: generate key: %w", err)
	}
	return newKey(priv), nil
}

// KeyFromSeed rebuilds the key MarshalSeed returned the seed of, for a key
// kept sealed at rest.
func KeyFromSeed(seed []byte) (Key, error) {
	if len(seed) != SeedSize {
		return Key{}, ErrBadSeed
	}
	return newKey(ed25519.NewKeyFromSeed(seed)), nil
}

func newKey(priv ed25519.PrivateKey) Key {
	return Key{priv: priv, kid: KeyID(priv.Public().(ed25519.PublicKey))}
}

// KeyID is the key id of an Ed25519 public key: the first 8 bytes of its
// SHA-256, as 16 lowercase hex digits.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// MarshalSeed returns a copy of the key's private seed, to be sealed before
// it is stored; nil for the zero Key. The caller owns (and should clear)
// the copy.
func (k Key) MarshalSeed() []byte {
	if k.priv == nil {
		return nil
	}
	return append([]byte(nil), k.priv.Seed()...)
}

// ID returns the key id that tokens signed by this key carry.
func (k Key) ID() string { return k.kid }

// PublicKey returns the public half, all a Verifier needs, so the preview
// proxy need never hold the private key; nil for the zero Key.
func (k Key) PublicKey() ed25519.PublicKey {
	if k.priv == nil {
		return nil
	}
	return k.priv.Public().(ed25519.PublicKey)
}

// String names the key by its id only.
func (k Key) String() string { return "previewtoken.Key{kid:" + k.kid + ", private:REDACTED}" }

// GoString is String, so %#v redacts too.
func (k Key) GoString() string { return k.String() }

// Format writes String for every verb, so no verb (%d, %x, %+v) prints the
// private key's bytes.
func (k Key) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, k.String()) }

// LogValue redacts the key in log/slog.
func (k Key) LogValue() slog.Value { return slog.StringValue(k.String()) }
