package previewtoken

import (
	"crypto/hmac"
	"crypto/sha256"
	"strings"
	"testing"
)

// BenchmarkVerify is a full Verify of a valid token (parse, Ed25519,
// strict claims, scope).
func BenchmarkVerify(b *testing.B) {
	k := mustKey(b, seedA)
	v := mustVerifier(b, k)
	c := testClaims()
	tok := mustIssue(b, k, c)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(tok, now0, c.SandboxID, c.Port); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHMACSHA256 is the baseline: an HMAC-SHA256 tag over the same
// signed bytes, checked in constant time, with no parsing. The ratio of
// the two is the price of a public-key token (a proxy that holds no
// signing secret) over a shared-secret one.
func BenchmarkHMACSHA256(b *testing.B) {
	k := mustKey(b, seedA)
	c := testClaims()
	tok := mustIssue(b, k, c)
	msg := []byte(sigContext + tok[:strings.LastIndexByte(tok, '.')])
	secret := seedB
	m := hmac.New(sha256.New, secret)
	m.Write(msg)
	tag := m.Sum(nil)
	b.ReportAllocs()
	for b.Loop() {
		m := hmac.New(sha256.New, secret)
		m.Write(msg)
		if !hmac.Equal(m.Sum(nil), tag) {
			b.Fatal("tag differs")
		}
	}
}
