package grant

import (
	"bytes"
	"fmt"
	"testing"

	"golang.org/x/mod/sumdb/note"
)

// fuzzKeys is a fixed grant key pair, so that the committed seed corpus
// holds grants validly signed under it.
func fuzzKeys(t testing.TB) (skey, vkey string) {
	t.Helper()
	skey, vkey, err := note.GenerateKey(bytes.NewReader(bytes.Repeat([]byte{7}, 64)), KeyName)
	if err != nil {
		t.Fatal(err)
	}
	return skey, vkey
}

// FuzzVerify feeds Verify random messages (signBody false) and random
// bodies signed under the pinned key (signBody true, which reaches the
// JSON and field checks). It must never panic; a refusal returns the zero
// Doc; anything accepted re-verifies to the same Doc and survives a
// Sign/Verify round trip unchanged.
func FuzzVerify(f *testing.F) {
	skey, vkey := fuzzKeys(f)
	good := mustSign(f, skey, validDoc())
	f.Add(good, false)
	f.Add([]byte(`{"v":1,"id":"g","bastion":"nod_abc123","allow":["egress"],"issued_at_ms":1,"expires_at_ms":9999999999999}`+"\n"), true)
	f.Add([]byte("not a note"), false)
	f.Fuzz(func(t *testing.T, msg []byte, signBody bool) {
		if signBody {
			s, err := note.NewSigner(skey)
			if err != nil {
				t.Fatal(err)
			}
			signed, err := note.Sign(&note.Note{Text: string(msg)}, s)
			if err != nil {
				return // not valid note text
			}
			msg = signed
		}
		d, r := Verify(msg, vkey, bastionID, t0)
		if r != "" {
			if fmt.Sprint(d) != fmt.Sprint(Doc{}) {
				t.Fatalf("refused (%q) with a Doc: %+v", r, d)
			}
			return
		}
		d2, r2 := Verify(msg, vkey, bastionID, t0)
		if r2 != "" || fmt.Sprint(d2) != fmt.Sprint(d) {
			t.Fatalf("re-verify: %q %+v, first %+v", r2, d2, d)
		}
		again, err := Sign(skey, d)
		if err != nil {
			t.Fatalf("Sign of an accepted Doc: %v", err)
		}
		d3, r3 := Verify(again, vkey, bastionID, t0)
		if r3 != "" || fmt.Sprint(d3) != fmt.Sprint(d) {
			t.Fatalf("round trip: %q %+v, want %+v", r3, d3, d)
		}
	})
}
