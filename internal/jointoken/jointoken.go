// Package jointoken parses and renders join tokens. It is shared by the
// control plane, which mints them, and bcd, which reads the pin from one.
package jointoken

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"

	"github.com/bettercompute/bettercompute/internal/ids"
)

// A join token reads "bcj1.<pin>.<id>.<secret>": pin is the base64url
// SHA-256 of the join signing key (so the node can check the trust bundle,
// and through it the gateway, before it sends the secret), id names the row
// and secret is 32 random bytes. Only SHA-256(secret) is stored.

// Prefix starts every join token of this format.
const Prefix = "bcj1"

// Token is a parsed join token.
type Token struct {
	Pin    [32]byte
	ID     string
	Secret string
}

// ErrTokenMalformed is returned by Parse for anything not of the form.
var ErrTokenMalformed = errors.New("jointoken: join token is malformed")

// Parse splits a join token into its parts.
func Parse(s string) (Token, error) {
	parts := strings.Split(strings.TrimSpace(s), ".")
	if len(parts) != 4 || parts[0] != Prefix || !ids.Valid("jt_", parts[2]) || len(parts[3]) != 43 {
		return Token{}, ErrTokenMalformed
	}
	pin, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || len(pin) != 32 {
		return Token{}, ErrTokenMalformed
	}
	if _, err := base64.RawURLEncoding.DecodeString(parts[3]); err != nil {
		return Token{}, ErrTokenMalformed
	}
	var t Token
	copy(t.Pin[:], pin)
	t.ID, t.Secret = parts[2], parts[3]
	return t, nil
}

// String renders the token.
func (t Token) String() string {
	return Prefix + "." + base64.RawURLEncoding.EncodeToString(t.Pin[:]) + "." + t.ID + "." + t.Secret
}

// HashSecret is what the control plane stores for a token secret.
func HashSecret(secret string) []byte {
	h := sha256.Sum256([]byte("bc-join-token\x00" + secret))
	return h[:]
}
