package previewtoken

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"testing"
	"time"
)

// Fixed keys and time: every test is deterministic.
var (
	seedA = bytes.Repeat([]byte{0xa1}, SeedSize)
	seedB = bytes.Repeat([]byte{0xb2}, SeedSize)
	now0  = time.Date(2026, 3, 4, 5, 6, 7, 8, time.UTC)
)

const maxTTL = time.Hour

func mustKey(t testing.TB, seed []byte) Key {
	t.Helper()
	k, err := KeyFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func mustVerifier(t testing.TB, keys ...Key) *Verifier {
	t.Helper()
	v, err := NewVerifier(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func testClaims() Claims {
	return Claims{SandboxID: "sbx_01HZY3", Port: 8080, Expires: now0.Add(10 * time.Minute), TenantID: "tn_acme-1"}
}

func mustIssue(t testing.TB, k Key, c Claims) string {
	t.Helper()
	tok, err := Issue(k, c, now0, maxTTL)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// signRaw signs any payload bytes under k as Issue would, so tests can
// present correctly signed tokens whose payload Issue would never write.
func signRaw(k Key, payload []byte) string {
	signed := "v1." + k.ID() + "." + base64.RawURLEncoding.EncodeToString(payload)
	sig := ed25519.Sign(k.priv, []byte(sigContext+signed))
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func wantReason(t *testing.T, err error, want string) {
	t.Helper()
	if got := ReasonOf(err); got != want {
		t.Fatalf("refusal reason %q (err %v), want %q", got, err, want)
	}
}
