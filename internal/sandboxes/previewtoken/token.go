package previewtoken

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

const (
	// MaxTokenLen caps a token's length; Verify refuses a longer one
	// before it reads anything else of it. The longest token Issue makes
	// (two 64-character ids, port 65535) is under 400 bytes.
	MaxTokenLen = 512
	// MaxIDLen is the longest sandbox or tenant id a token carries.
	MaxIDLen = 64

	version = "v1"
	// sigContext separates these signatures from every other use of an
	// Ed25519 key: it starts the signed bytes.
	sigContext = "bc-preview-v1\x00"
	kidLen     = 16
	sigLen     = 86 // unpadded base64url of an Ed25519 signature
)

// b64 is unpadded base64url that refuses non-zero padding bits. It still
// skips CR and LF, so callers check the alphabet first (tokenChars).
var b64 = base64.RawURLEncoding.Strict()

// Claims is what a token grants: requests to Port of sandbox SandboxID
// (of tenant TenantID) until Expires (exclusive).
type Claims struct {
	SandboxID string
	Port      uint16
	Expires   time.Time
	TenantID  string
}

// wireClaims is the signed payload; its JSON, as encoding/json writes it,
// is the only one Verify accepts.
type wireClaims struct {
	Sandbox string `json:"sbx"`
	Port    uint16 `json:"port"`
	Exp     int64  `json:"exp"`
	Tenant  string `json:"tnt"`
}

// Issue signs a token granting c under k. It refuses invalid claims
// (ReasonBadClaims) and an expiry not after now or more than maxTTL after
// it (ReasonBadTTL).
func Issue(k Key, c Claims, now time.Time, maxTTL time.Duration) (string, error) {
	if k.priv == nil {
		return "", ErrZeroKey
	}
	if err := checkExpiryRange(c.Expires); err != nil {
		return "", err
	}
	w := wireClaims{Sandbox: c.SandboxID, Port: c.Port, Exp: c.Expires.UnixNano(), Tenant: c.TenantID}
	if err := w.check(); err != nil {
		return "", err
	}
	if ttl := c.Expires.Sub(now); ttl <= 0 || ttl > maxTTL {
		return "", refuse(ReasonBadTTL, "expiry must be after now and within the maximum ttl")
	}
	return encode(k, w)
}

// checkExpiryRange refuses an expiry UnixNano cannot represent.
func checkExpiryRange(t time.Time) error {
	if t.Before(time.Unix(0, 1)) || t.After(time.Unix(0, math.MaxInt64)) {
		return refuse(ReasonBadClaims, "expiry out of range")
	}
	return nil
}

func encode(k Key, w wireClaims) (string, error) {
	payload, err := json.Marshal(w)
	if err != nil {
		return "", fmt.Errorf("previewtoken: encode claims: %w", err)
	}
	signed := version + "." + k.kid + "." + b64.EncodeToString(payload)
	sig := ed25519.Sign(k.priv, []byte(sigContext+signed))
	tok := signed + "." + b64.EncodeToString(sig)
	if len(tok) > MaxTokenLen {
		return "", errors.New("previewtoken: token over MaxTokenLen") // unreachable with checked claims
	}
	return tok, nil
}

// check refuses claims Issue must not sign and Verify must not accept.
func (w wireClaims) check() error {
	if !validID(w.Sandbox) || !validID(w.Tenant) {
		return refuse(ReasonBadClaims, "ids must be 1 to 64 characters of [A-Za-z0-9_-]")
	}
	if w.Port == 0 {
		return refuse(ReasonBadClaims, "port 0")
	}
	if w.Exp <= 0 {
		return refuse(ReasonBadClaims, "expiry out of range")
	}
	return nil
}

func validID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// decodeClaims reads the signed payload strictly: one JSON object with
// exactly the known fields, in exactly the bytes json.Marshal writes for
// it (so key order, whitespace, escapes, case and duplicates are refused),
// and claims that check. The byte comparison alone would refuse unknown
// fields and trailing data too; DisallowUnknownFields and the single-value
// check stay as the first gate, so a later change to the comparison does
// not open them.
func decodeClaims(payload []byte) (wireClaims, error) {
	var w wireClaims
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return wireClaims{}, refuse(ReasonBadClaims, "payload is not the claims object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return wireClaims{}, refuse(ReasonBadClaims, "data after the claims object")
	}
	canon, err := json.Marshal(w)
	if err != nil || !bytes.Equal(canon, payload) {
		return wireClaims{}, refuse(ReasonBadClaims, "payload is not canonical")
	}
	if err := w.check(); err != nil {
		return wireClaims{}, err
	}
	return w, nil
}
