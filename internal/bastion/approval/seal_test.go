package approval

import (
	"bytes"
	"testing"
)

func TestSealOpen(t *testing.T) {
	k := DeriveKey(testSecret, "purpose a")
	if k == DeriveKey(testSecret, "purpose b") || k == DeriveKey([]byte("other secret bytes.."), "purpose a") {
		t.Fatal("keys for other purposes or secrets are equal")
	}
	if k != DeriveKey(testSecret, "purpose a") {
		t.Fatal("DeriveKey is not deterministic")
	}
	sealed, err := Seal(k, []byte("aad"), []byte("plain"))
	must(t, err)
	again, err := Seal(k, []byte("aad"), []byte("plain"))
	must(t, err)
	if bytes.Equal(sealed, again) || bytes.Contains(sealed, []byte("plain")) {
		t.Fatal("sealing repeats its nonce or shows the plaintext")
	}
	pt, err := Open(k, []byte("aad"), sealed)
	if err != nil || string(pt) != "plain" {
		t.Fatalf("Open: %q %v", pt, err)
	}
	flipped := append([]byte(nil), sealed...)
	flipped[len(flipped)-1] ^= 1
	for name, c := range map[string]struct {
		key         [32]byte
		aad, sealed []byte
	}{
		"other aad":  {k, []byte("aae"), sealed},
		"other key":  {DeriveKey(testSecret, "purpose b"), []byte("aad"), sealed},
		"flipped":    {k, []byte("aad"), flipped},
		"short":      {k, []byte("aad"), sealed[:27]},
		"empty":      {k, []byte("aad"), nil},
		"nonce only": {k, []byte("aad"), sealed[:12]},
	} {
		_, err := Open(c.key, c.aad, c.sealed)
		if err == nil {
			t.Errorf("%s: opened", name)
			continue
		}
		wantRefused(t, err, ReasonSealBroken)
	}
}
