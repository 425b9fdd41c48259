package previewtoken

import (
	"math"
	"testing"
	"time"
)

var allReasons = map[string]bool{
	ReasonMalformed: true, ReasonUnknownKey: true, ReasonBadSignature: true, ReasonExpired: true,
	ReasonWrongSandbox: true, ReasonWrongPort: true, ReasonBadClaims: true,
}

// FuzzVerify: Verify never panics, refuses only with a Verify reason, and
// accepts a token only in the one canonical form: an accepted token
// verifies again to the same claims, which are the request's scope and
// unexpired, and is byte for byte the token Issue makes for those claims
// under the kid's key (so no two strings verify for the same claims).
func FuzzVerify(f *testing.F) {
	kA, kB := mustKey(f, seedA), mustKey(f, seedB)
	v := mustVerifier(f, kA, kB)
	keys := map[string]Key{kA.ID(): kA, kB.ID(): kB}
	c := testClaims()
	tokA, tokB := mustIssue(f, kA, c), mustIssue(f, kB, c)
	n := now0.UnixNano()
	f.Add(tokA, c.SandboxID, c.Port, n)
	f.Add(tokB, c.SandboxID, c.Port, n)
	f.Add(tokA, "other", c.Port, n)
	f.Add(tokA, c.SandboxID, uint16(1), n)
	f.Add(tokA, c.SandboxID, c.Port, c.Expires.UnixNano())
	f.Add(tokA+".", c.SandboxID, c.Port, n)
	f.Add(tokA[:len(tokA)-1]+"B", c.SandboxID, c.Port, n)
	f.Add("v1."+kA.ID()+"."+tokA[len("v1.")+kidLen+1:], c.SandboxID, c.Port, n)
	f.Add(signRaw(kA, []byte(`{"sbx":"s","port":1,"exp":9223372036854775807,"tnt":"t"}`)), "s", uint16(1), int64(math.MinInt64))
	f.Add(signRaw(kA, []byte(`{"sbx":"s","port":1,"exp":1,"tnt":"t","x":1}`)), "s", uint16(1), int64(0))
	f.Add("", "", uint16(0), int64(0))
	f.Fuzz(func(t *testing.T, token, sandbox string, port uint16, nowNano int64) {
		now := time.Unix(0, nowNano)
		got, err := v.Verify(token, now, sandbox, port)
		if err != nil {
			if !allReasons[ReasonOf(err)] || got != (Claims{}) {
				t.Fatalf("refusal %v (reason %q) with claims %+v", err, ReasonOf(err), got)
			}
			return
		}
		if got.SandboxID != sandbox || got.Port != port || !now.Before(got.Expires) {
			t.Fatalf("accepted claims %+v outside the request (%q, %d, %v)", got, sandbox, port, now)
		}
		again, err := v.Verify(token, now, sandbox, port)
		if err != nil || again != got {
			t.Fatalf("re-verify: %+v, %v; first %+v", again, err, got)
		}
		k, ok := keys[token[len("v1."):len("v1.")+kidLen]]
		if !ok {
			t.Fatalf("accepted token %q under no key", token)
		}
		reissued, err := Issue(k, got, now, time.Duration(math.MaxInt64))
		if err != nil || reissued != token {
			t.Fatalf("accepted %q, but Issue makes %q (%v) for its claims", token, reissued, err)
		}
	})
}
