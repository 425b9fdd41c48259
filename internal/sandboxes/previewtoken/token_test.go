package previewtoken

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"math"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	k := mustKey(t, seedA)
	v := mustVerifier(t, k)
	c := testClaims()
	tok := mustIssue(t, k, c)
	got, err := v.Verify(tok, now0, c.SandboxID, c.Port)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	if got.SandboxID != c.SandboxID || got.Port != c.Port || got.TenantID != c.TenantID || !got.Expires.Equal(c.Expires) {
		t.Fatalf("claims %+v, want %+v", got, c)
	}
	if !strings.HasPrefix(tok, "v1."+k.ID()+".") {
		t.Fatalf("token %q does not start with v1.<kid>.", tok)
	}
	if url.PathEscape(tok) != tok {
		t.Fatalf("token %q is not a URL path segment as is", tok)
	}
	// The longest claims still fit.
	long := Claims{SandboxID: strings.Repeat("s", MaxIDLen), Port: 65535, Expires: now0.Add(maxTTL), TenantID: strings.Repeat("-", MaxIDLen)}
	tok = mustIssue(t, k, long)
	if len(tok) > MaxTokenLen-100 {
		t.Fatalf("longest token is %d bytes, want well under %d", len(tok), MaxTokenLen)
	}
	if _, err := v.Verify(tok, now0, long.SandboxID, long.Port); err != nil {
		t.Fatalf("verify longest: %v", err)
	}
}

func TestIssueRefusals(t *testing.T) {
	k := mustKey(t, seedA)
	cases := []struct {
		name   string
		mod    func(*Claims)
		ttlMax time.Duration
		want   string
	}{
		{"port 0", func(c *Claims) { c.Port = 0 }, maxTTL, ReasonBadClaims},
		{"empty sandbox", func(c *Claims) { c.SandboxID = "" }, maxTTL, ReasonBadClaims},
		{"empty tenant", func(c *Claims) { c.TenantID = "" }, maxTTL, ReasonBadClaims},
		{"sandbox 65 chars", func(c *Claims) { c.SandboxID = strings.Repeat("a", 65) }, maxTTL, ReasonBadClaims},
		{"tenant 65 chars", func(c *Claims) { c.TenantID = strings.Repeat("a", 65) }, maxTTL, ReasonBadClaims},
		{"sandbox dot", func(c *Claims) { c.SandboxID = "sbx.1" }, maxTTL, ReasonBadClaims},
		{"sandbox slash", func(c *Claims) { c.SandboxID = "sbx/1" }, maxTTL, ReasonBadClaims},
		{"sandbox space", func(c *Claims) { c.SandboxID = "sbx 1" }, maxTTL, ReasonBadClaims},
		{"sandbox non-ascii", func(c *Claims) { c.SandboxID = "sbxé" }, maxTTL, ReasonBadClaims},
		{"tenant quote", func(c *Claims) { c.TenantID = `tn"1` }, maxTTL, ReasonBadClaims},
		{"tenant NUL", func(c *Claims) { c.TenantID = "tn\x00" }, maxTTL, ReasonBadClaims},
		{"expiry before 1970", func(c *Claims) { c.Expires = time.Unix(-1, 0) }, 1 << 62, ReasonBadClaims},
		{"expiry past 2262", func(c *Claims) { c.Expires = time.Date(2263, 1, 1, 0, 0, 0, 0, time.UTC) }, 1 << 62, ReasonBadClaims},
		{"expiry in 2600 (UnixNano wraps to a positive time)", func(c *Claims) { c.Expires = time.Date(2600, 1, 1, 0, 0, 0, 0, time.UTC) }, math.MaxInt64, ReasonBadClaims},
		{"ttl 0", func(c *Claims) { c.Expires = now0 }, maxTTL, ReasonBadTTL},
		{"ttl negative", func(c *Claims) { c.Expires = now0.Add(-time.Second) }, maxTTL, ReasonBadTTL},
		{"ttl over max by 1ns", func(c *Claims) { c.Expires = now0.Add(maxTTL + 1) }, maxTTL, ReasonBadTTL},
		{"max ttl 0", func(c *Claims) {}, 0, ReasonBadTTL},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := testClaims()
			tc.mod(&c)
			tok, err := Issue(k, c, now0, tc.ttlMax)
			if tok != "" {
				t.Fatalf("issued %q", tok)
			}
			wantReason(t, err, tc.want)
		})
	}
	t.Run("ttl exactly max and 1ns are issued", func(t *testing.T) {
		for _, ttl := range []time.Duration{maxTTL, 1} {
			c := testClaims()
			c.Expires = now0.Add(ttl)
			if _, err := Issue(k, c, now0, maxTTL); err != nil {
				t.Fatalf("ttl %v: %v", ttl, err)
			}
		}
	})
	t.Run("zero key", func(t *testing.T) {
		if _, err := Issue(Key{}, testClaims(), now0, maxTTL); !errors.Is(err, ErrZeroKey) {
			t.Fatalf("err %v, want ErrZeroKey", err)
		}
	})
}

// replaceAt returns s with its byte at i replaced by c.
func replaceAt(s string, i int, c byte) string {
	return s[:i] + string(c) + s[i+1:]
}

// otherB64 is a base64url character other than c whose top two bits
// differ, so it changes the decoded bytes, not only padding bits.
func otherB64(c byte) byte {
	const alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alpha, c)
	return alpha[(i+32)%64]
}

func TestVerifyRefusals(t *testing.T) {
	kA, kB := mustKey(t, seedA), mustKey(t, seedB)
	v := mustVerifier(t, kA, kB)
	c := testClaims()
	tok := mustIssue(t, kA, c)
	f := strings.Split(tok, ".")
	payloadAt, sigAt := len(f[0])+len(f[1])+2, len(tok)-len(f[3])
	sigLast := f[3][len(f[3])-1]
	cases := []struct {
		name  string
		token string
		now   time.Time
		sbx   string
		port  uint16
		want  string
	}{
		{"tamper version", replaceAt(tok, 1, '2'), now0, c.SandboxID, c.Port, ReasonMalformed},
		{"tamper kid", replaceAt(tok, 3, "0123456789abcdef"[(strings.IndexByte("0123456789abcdef", tok[3])+1)%16]), now0, c.SandboxID, c.Port, ReasonUnknownKey},
		{"kid flipped to the other key", "v1." + kB.ID() + tok[len("v1.")+kidLen:], now0, c.SandboxID, c.Port, ReasonBadSignature},
		{"tamper payload", replaceAt(tok, payloadAt, otherB64(tok[payloadAt])), now0, c.SandboxID, c.Port, ReasonBadSignature},
		{"tamper signature", replaceAt(tok, sigAt, otherB64(tok[sigAt])), now0, c.SandboxID, c.Port, ReasonBadSignature},
		{"signature padding bits set", tok[:len(tok)-1] + string(sigLast+1), now0, c.SandboxID, c.Port, ReasonMalformed},
		{"expired by 1ns", tok, c.Expires.Add(1), c.SandboxID, c.Port, ReasonExpired},
		{"at expiry", tok, c.Expires, c.SandboxID, c.Port, ReasonExpired},
		{"other sandbox", tok, now0, "sbx_01HZY4", c.Port, ReasonWrongSandbox},
		{"other port", tok, now0, c.SandboxID, 8081, ReasonWrongPort},
		{"extra segment", tok + ".AAAA", now0, c.SandboxID, c.Port, ReasonMalformed},
		{"trailing dot", tok + ".", now0, c.SandboxID, c.Port, ReasonMalformed},
		{"missing segment", strings.Join(f[:3], "."), now0, c.SandboxID, c.Port, ReasonMalformed},
		{"padded base64", strings.Join([]string{f[0], f[1], base64.URLEncoding.EncodeToString(mustB64(t, f[2])), f[3]}, "."), now0, c.SandboxID, c.Port, ReasonMalformed},
		{"standard base64 alphabet", replaceAt(tok, payloadAt, '+'), now0, c.SandboxID, c.Port, ReasonMalformed},
		{"newline in payload", tok[:payloadAt+4] + "\n" + tok[payloadAt+4:], now0, c.SandboxID, c.Port, ReasonMalformed},
		{"uppercase kid", "v1." + strings.ToUpper(f[1]) + tok[len("v1.")+kidLen:], now0, c.SandboxID, c.Port, ReasonMalformed},
		{"oversize", "v1." + strings.Repeat("A", MaxTokenLen), now0, c.SandboxID, c.Port, ReasonMalformed},
		{"oversize but signed", signRaw(kA, []byte(`{"sbx":"`+strings.Repeat("s", 300)+`","port":8080,"exp":1,"tnt":"t"}`)), now0, c.SandboxID, c.Port, ReasonMalformed},
		{"empty", "", now0, c.SandboxID, c.Port, ReasonMalformed},
		{"empty payload", f[0] + "." + f[1] + ".." + f[3], now0, c.SandboxID, c.Port, ReasonMalformed},
		{"short signature", tok[:len(tok)-2], now0, c.SandboxID, c.Port, ReasonMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := v.Verify(tc.token, tc.now, tc.sbx, tc.port)
			if got != (Claims{}) {
				t.Fatalf("refusal returned claims %+v", got)
			}
			wantReason(t, err, tc.want)
		})
	}
	t.Run("1ns before expiry is accepted", func(t *testing.T) {
		if _, err := v.Verify(tok, c.Expires.Add(-1), c.SandboxID, c.Port); err != nil {
			t.Fatal(err)
		}
	})
}

func mustB64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestVerifyRefusesNonCanonicalClaims presents payloads correctly signed
// by the verifier's own key that Issue would never write: only the exact
// canonical claims JSON is accepted.
func TestVerifyRefusesNonCanonicalClaims(t *testing.T) {
	k := mustKey(t, seedA)
	v := mustVerifier(t, k)
	exp := now0.Add(time.Minute).UnixNano()
	canon := `{"sbx":"s1","port":80,"exp":` + itoa(exp) + `,"tnt":"t1"}`
	if _, err := v.Verify(signRaw(k, []byte(canon)), now0, "s1", 80); err != nil {
		t.Fatalf("canonical payload refused: %v", err)
	}
	e := itoa(exp)
	cases := map[string]string{
		"unknown field":    `{"sbx":"s1","port":80,"exp":` + e + `,"tnt":"t1","admin":true}`,
		"trailing value":   canon + `{}`,
		"trailing space":   canon + ` `,
		"space inside":     `{"sbx": "s1","port":80,"exp":` + e + `,"tnt":"t1"}`,
		"keys reordered":   `{"port":80,"sbx":"s1","exp":` + e + `,"tnt":"t1"}`,
		"duplicate key":    `{"sbx":"s2","sbx":"s1","port":80,"exp":` + e + `,"tnt":"t1"}`,
		"key case":         `{"SBX":"s1","port":80,"exp":` + e + `,"tnt":"t1"}`,
		"escaped char":     `{"sbx":"\u00731","port":80,"exp":` + e + `,"tnt":"t1"}`,
		"missing tenant":   `{"sbx":"s1","port":80,"exp":` + e + `}`,
		"null sandbox":     `{"sbx":null,"port":80,"exp":` + e + `,"tnt":"t1"}`,
		"port 0":           `{"sbx":"s1","port":0,"exp":` + e + `,"tnt":"t1"}`,
		"port too big":     `{"sbx":"s1","port":65616,"exp":` + e + `,"tnt":"t1"}`,
		"port float":       `{"sbx":"s1","port":80.0,"exp":` + e + `,"tnt":"t1"}`,
		"port string":      `{"sbx":"s1","port":"80","exp":` + e + `,"tnt":"t1"}`,
		"exp exponent":     `{"sbx":"s1","port":80,"exp":1e30,"tnt":"t1"}`,
		"exp zero":         `{"sbx":"s1","port":80,"exp":0,"tnt":"t1"}`,
		"exp negative":     `{"sbx":"s1","port":80,"exp":-5,"tnt":"t1"}`,
		"id with dot":      `{"sbx":"s.1","port":80,"exp":` + e + `,"tnt":"t1"}`,
		"id too long":      `{"sbx":"` + strings.Repeat("s", 65) + `","port":80,"exp":` + e + `,"tnt":"t1"}`,
		"array":            `[]`,
		"not json":         `v1`,
		"leading space":    ` ` + canon,
		"utf8 BOM":         "\ufeff" + canon,
		"trailing newline": `{"sbx":"s1","port":80,"exp":` + e + `,"tnt":"t1"}` + "\n",
	}
	for name, payload := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := v.Verify(signRaw(k, []byte(payload)), now0, "s1", 80)
			wantReason(t, err, ReasonBadClaims)
		})
	}
}

func itoa(n int64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// TestTamperEveryByte changes each byte of a valid token (three ways) and
// requires a refusal whose reason fits the part that changed.
func TestTamperEveryByte(t *testing.T) {
	k := mustKey(t, seedA)
	v := mustVerifier(t, k)
	c := testClaims()
	tok := mustIssue(t, k, c)
	f := strings.Split(tok, ".")
	payloadAt, sigAt := len(f[0])+len(f[1])+2, len(tok)-len(f[3])
	for i := 0; i < len(tok); i++ {
		allowed := map[string]bool{ReasonMalformed: true}
		switch {
		case i >= sigAt || i >= payloadAt && i < sigAt-1:
			allowed[ReasonBadSignature] = true
		case i >= 3 && i < 3+kidLen:
			allowed[ReasonUnknownKey] = true
		}
		for _, r := range []byte{tok[i] ^ 1, tok[i] ^ 0x20, '.'} {
			if r == tok[i] {
				continue
			}
			bad := replaceAt(tok, i, r)
			_, err := v.Verify(bad, now0, c.SandboxID, c.Port)
			if !allowed[ReasonOf(err)] {
				t.Fatalf("byte %d %q->%q: err %v, want one of %v", i, tok[i], r, err, allowed)
			}
		}
	}
}

// TestSignatureBindsContext: a signature by the right key over the token's
// bytes without the bc-preview-v1 context (what another protocol signing
// the same bytes would make) is refused.
func TestSignatureBindsContext(t *testing.T) {
	k := mustKey(t, seedA)
	v := mustVerifier(t, k)
	c := testClaims()
	tok := mustIssue(t, k, c)
	signed := tok[:strings.LastIndexByte(tok, '.')]
	for _, msg := range []string{signed, "bc-preview-v2\x00" + signed, "bc-preview-v1" + signed} {
		bad := signed + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(k.priv, []byte(msg)))
		_, err := v.Verify(bad, now0, c.SandboxID, c.Port)
		wantReason(t, err, ReasonBadSignature)
	}
}

// TestKeyRotation: a verifier made with only the new key refuses every
// token of the old key (preview-unknown-key), whatever its expiry; the
// old key is accepted only when the caller passes it explicitly.
func TestKeyRotation(t *testing.T) {
	oldK, newK := mustKey(t, seedA), mustKey(t, seedB)
	c := testClaims()
	oldTok, newTok := mustIssue(t, oldK, c), mustIssue(t, newK, c)
	before := mustVerifier(t, oldK)
	if _, err := before.Verify(oldTok, now0, c.SandboxID, c.Port); err != nil {
		t.Fatalf("before rotation: %v", err)
	}
	after := mustVerifier(t, newK)
	_, err := after.Verify(oldTok, now0, c.SandboxID, c.Port)
	wantReason(t, err, ReasonUnknownKey)
	if _, err := after.Verify(newTok, now0, c.SandboxID, c.Port); err != nil {
		t.Fatalf("new token after rotation: %v", err)
	}
	pub, err := NewVerifierFromPublic(newK.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	_, err = pub.Verify(oldTok, now0, c.SandboxID, c.Port)
	wantReason(t, err, ReasonUnknownKey)
	grace := mustVerifier(t, newK, oldK)
	for _, tok := range []string{oldTok, newTok} {
		if _, err := grace.Verify(tok, now0, c.SandboxID, c.Port); err != nil {
			t.Fatalf("explicit grace: %v", err)
		}
	}
	none := mustVerifier(t)
	_, err = none.Verify(newTok, now0, c.SandboxID, c.Port)
	wantReason(t, err, ReasonUnknownKey)
}

func TestNewVerifierRefusals(t *testing.T) {
	k := mustKey(t, seedA)
	if _, err := NewVerifier(k, Key{}); !errors.Is(err, ErrZeroKey) {
		t.Fatalf("zero key: %v", err)
	}
	if _, err := NewVerifier(k, mustKey(t, seedA)); !errors.Is(err, ErrDuplicateKey) {
		t.Fatalf("duplicate key: %v", err)
	}
	if _, err := NewVerifierFromPublic(ed25519.PublicKey{1, 2, 3}); !errors.Is(err, ErrZeroKey) {
		t.Fatalf("short public key: %v", err)
	}
}
