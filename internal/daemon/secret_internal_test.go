package daemon

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// TestOpenSecretAnswerRefusesExpired checks the node's side of the JWE's
// expiry: an answer is opened only before its exp (header and sealed
// payload agreeing), only for this request's reference and id, and only
// under the request's one-time key.
func TestOpenSecretAnswerRefusesExpired(t *testing.T) {
	otk, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Unix(1_800_000_000, 0)
	answer := func(key *ecdsa.PublicKey, ref, req string, exp, headerExp int64) string {
		payload, _ := json.Marshal(map[string]any{"ref": ref, "version": 1, "value": "dmFsdWU=", "exp": exp, "request_id": req})
		enc, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{Algorithm: jose.ECDH_ES_A256KW, Key: key},
			(&jose.EncrypterOptions{}).WithType("bc-secret+jwe").WithHeader("exp", headerExp))
		if err != nil {
			t.Fatal(err)
		}
		obj, err := enc.Encrypt(payload)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := obj.CompactSerialize()
		return s
	}
	exp := now.Add(5 * time.Minute).Unix()
	v, err := openSecretAnswer(answer(&otk.PublicKey, "secret://root/a", "req-1", exp, exp), otk, "secret://root/a", "req-1", now)
	if err != nil || string(v) != "value" {
		t.Fatalf("good answer: %q %v", v, err)
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for name, c := range map[string]struct {
		jwe string
		at  time.Time
	}{
		"expired":            {answer(&otk.PublicKey, "secret://root/a", "req-1", exp, exp), time.Unix(exp, 0)},
		"long expired":       {answer(&otk.PublicKey, "secret://root/a", "req-1", exp, exp), now.Add(time.Hour)},
		"header exp differs": {answer(&otk.PublicKey, "secret://root/a", "req-1", exp, exp+3600), now},
		"another reference":  {answer(&otk.PublicKey, "secret://root/b", "req-1", exp, exp), now},
		"another request":    {answer(&otk.PublicKey, "secret://root/a", "req-2", exp, exp), now},
		"another key":        {answer(&other.PublicKey, "secret://root/a", "req-1", exp, exp), now},
		"not a jwe":          {"e30.e30.e30", now},
	} {
		if v, err := openSecretAnswer(c.jwe, otk, "secret://root/a", "req-1", c.at); err == nil {
			t.Errorf("%s: opened %q", name, v)
		}
	}
}
