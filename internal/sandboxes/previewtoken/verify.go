package previewtoken

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrDuplicateKey is returned by NewVerifier for two keys with one key id.
var ErrDuplicateKey = errors.New("previewtoken: two verifier keys share a key id")

// Verifier checks tokens against a fixed set of public keys (the current
// preview key, and any other the caller passes explicitly). It is
// immutable, so safe for concurrent use; rotation makes a new one.
type Verifier struct {
	keys map[string]ed25519.PublicKey
}

// NewVerifier returns a Verifier for keys, keeping only their public
// halves. No key is fine (every token is then ReasonUnknownKey); a zero
// Key or two keys with one id are refused.
func NewVerifier(keys ...Key) (*Verifier, error) {
	pubs := make([]ed25519.PublicKey, 0, len(keys))
	for _, k := range keys {
		pubs = append(pubs, k.PublicKey()) // nil for a zero Key: refused below
	}
	return NewVerifierFromPublic(pubs...)
}

// NewVerifierFromPublic is NewVerifier from public keys alone, for a proxy
// that is given no private key.
func NewVerifierFromPublic(pubs ...ed25519.PublicKey) (*Verifier, error) {
	v := &Verifier{keys: make(map[string]ed25519.PublicKey, len(pubs))}
	for _, p := range pubs {
		if len(p) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("previewtoken: verifier key of %d bytes: %w", len(p), ErrZeroKey)
		}
		kid := KeyID(p)
		if _, dup := v.keys[kid]; dup {
			return nil, ErrDuplicateKey
		}
		v.keys[kid] = append(ed25519.PublicKey(nil), p...)
	}
	return v, nil
}

// Verify checks token for a request to port of sandboxID at now and
// returns its claims, or a *RefusedError. In order: the form (size cap
// and alphabet before any decode, then the exact fields, ReasonMalformed),
// the key id (ReasonUnknownKey), the signature over the context and the
// token's bytes, before the payload is decoded (ReasonBadSignature), the
// payload, strictly (ReasonBadClaims), the expiry (ReasonExpired: now at
// or after it) and the scope (ReasonWrongSandbox, ReasonWrongPort).
//
// Nothing secret is compared here: the token, the key ids and the public
// keys are all public, and the one check that involves the signature is
// ed25519.Verify.
func (v *Verifier) Verify(token string, now time.Time, sandboxID string, port uint16) (Claims, error) {
	p, err := parse(token)
	if err != nil {
		return Claims{}, err
	}
	pub, ok := v.keys[p.kid]
	if !ok {
		return Claims{}, refuse(ReasonUnknownKey, "")
	}
	if !ed25519.Verify(pub, []byte(sigContext+p.signed), p.sig) {
		return Claims{}, refuse(ReasonBadSignature, "")
	}
	w, err := decodeClaims(p.payload)
	if err != nil {
		return Claims{}, err
	}
	c := Claims{SandboxID: w.Sandbox, Port: w.Port, Expires: time.Unix(0, w.Exp).UTC(), TenantID: w.Tenant}
	switch {
	case !now.Before(c.Expires):
		return Claims{}, refuse(ReasonExpired, "")
	case c.SandboxID != sandboxID:
		return Claims{}, refuse(ReasonWrongSandbox, "")
	case c.Port != port:
		return Claims{}, refuse(ReasonWrongPort, "")
	}
	return c, nil
}

// parsed is a token split and decoded, not yet verified.
type parsed struct {
	kid     string
	signed  string // "v1.<kid>.<payload>": what the signature covers after the context
	payload []byte
	sig     []byte
}

// parse splits token into exactly its four fields and decodes them
// strictly; anything else is ReasonMalformed.
func parse(token string) (parsed, error) {
	if len(token) > MaxTokenLen {
		return parsed{}, refuse(ReasonMalformed, "token too long")
	}
	if !tokenChars(token) {
		return parsed{}, refuse(ReasonMalformed, "character outside [A-Za-z0-9._-]")
	}
	f := strings.Split(token, ".")
	if len(f) != 4 || f[0] != version {
		return parsed{}, refuse(ReasonMalformed, "not v1.<kid>.<payload>.<sig>")
	}
	if !lowerHex(f[1]) {
		return parsed{}, refuse(ReasonMalformed, "kid is not 16 lowercase hex digits")
	}
	payload, err := b64.DecodeString(f[2])
	if err != nil || len(payload) == 0 {
		return parsed{}, refuse(ReasonMalformed, "payload is not canonical base64url")
	}
	sig, err := b64.DecodeString(f[3])
	if err != nil || len(f[3]) != sigLen || len(sig) != ed25519.SignatureSize {
		return parsed{}, refuse(ReasonMalformed, "signature is not canonical base64url of 64 bytes")
	}
	return parsed{kid: f[1], signed: token[:len(token)-len(f[3])-1], payload: payload, sig: sig}, nil
}

// tokenChars reports whether every byte of s is in [A-Za-z0-9._-], the
// token alphabet (base64url, hex and the dots), so no decoder ever sees a
// byte it would skip (CR, LF) or need escaped in a URL.
func tokenChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

func lowerHex(s string) bool {
	if len(s) != kidLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
