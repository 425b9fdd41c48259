package driver

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
)

// TestSecretDigestIsKeyedUnderCallerNonce checks that secret.digest never
// answers an unkeyed hash of the value: it answers HMAC-SHA256 keyed with
// the value over the caller's nonce, two nonces give unrelated answers,
// and a payload without a valid nonce is refused payload-invalid before
// the secret is fetched.
func TestSecretDigestIsKeyedUnderCallerNonce(t *testing.T) {
	value := []byte("hunter2")
	fetched := 0
	ctx := WithSecrets(context.Background(), func(_ context.Context, ref string) ([]byte, error) {
		fetched++
		if ref != "secret://root/demo" {
			t.Errorf("fetched %q", ref)
		}
		return bytes.Clone(value), nil
	})
	unkeyed := sha256.Sum256(value)
	answers := map[string]bool{}
	for _, nonce := range []string{strings.Repeat("00", 16), strings.Repeat("ab", 32), strings.Repeat("Ff", 64)} {
		for _, d := range []Driver{NewSim("s"), NewLinux()} {
			out, err := d.Run(ctx, "secret.digest", []byte(`{"ref":"secret://root/demo","nonce":"`+nonce+`"}`))
			if err != nil {
				t.Fatalf("%s nonce %s: %v", d.Name(), nonce, err)
			}
			var res map[string]string
			if err := json.Unmarshal(out, &res); err != nil {
				t.Fatal(err)
			}
			n, _ := hex.DecodeString(nonce)
			mac := hmac.New(sha256.New, value)
			mac.Write(n)
			if res["hmac_sha256"] != hex.EncodeToString(mac.Sum(nil)) || res["nonce"] != hex.EncodeToString(n) || res["ref"] != "secret://root/demo" || len(res) != 3 {
				t.Fatalf("%s answered %s", d.Name(), out)
			}
			if bytes.Contains(out, []byte(hex.EncodeToString(unkeyed[:]))) || bytes.Contains(out, value) {
				t.Fatalf("%s answer carries the value or its unkeyed hash: %s", d.Name(), out)
			}
			answers[res["hmac_sha256"]] = true
		}
	}
	if len(answers) != 3 {
		t.Fatalf("%d distinct answers for 3 nonces", len(answers))
	}
	fetched = 0
	for _, p := range []string{
		`{"ref":"secret://root/demo"}`,
		`{"ref":"secret://root/demo","nonce":""}`,
		`{"ref":"secret://root/demo","nonce":"` + strings.Repeat("00", 15) + `"}`,
		`{"ref":"secret://root/demo","nonce":"` + strings.Repeat("00", 65) + `"}`,
		`{"ref":"secret://root/demo","nonce":"` + strings.Repeat("zz", 16) + `"}`,
		`{"ref":"secret://root/demo","nonce":"` + strings.Repeat("0", 33) + `"}`,
		`{"ref":"secret://root/demo","nonce":"` + strings.Repeat("00", 16) + `","extra":1}`,
		`{"ref":"","nonce":"` + strings.Repeat("00", 16) + `"}`,
		`{"ref":"secret://root/demo","nonce":"` + strings.Repeat("00", 16) + `"} {}`,
		`not json`,
	} {
		if _, err := NewSim("s").Run(ctx, "secret.digest", []byte(p)); err == nil || err.Error() != "payload-invalid" {
			t.Errorf("%s: got %v, want payload-invalid", p, err)
		}
	}
	if fetched != 0 {
		t.Fatalf("a refused payload fetched the secret %d times", fetched)
	}
}

func FuzzDecodeDigestPayload(f *testing.F) {
	f.Add([]byte(`{"ref":"secret://root/demo","nonce":"00000000000000000000000000000000"}`))
	f.Add([]byte(`{"ref":"x"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		ref, nonce, err := decodeDigestPayload(payload)
		if err != nil {
			return
		}
		if ref == "" || len(nonce) < MinDigestNonce || len(nonce) > MaxDigestNonce {
			t.Fatalf("accepted ref %q nonce of %d bytes", ref, len(nonce))
		}
	})
}
