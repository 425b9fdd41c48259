package ops

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"
)

// FuzzDecode: Decode never panics; every error is an INVALID_INPUT
// refusal; an accepted op has a known kind other than terminal, passes its
// kind's check again, and its canonical args decode back to the same args
// (so the digest an approval is bound to is stable).
func FuzzDecode(f *testing.F) {
	for _, b := range goodBodies() {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		op, err := Decode(b)
		if err != nil {
			var re *RefusedError
			if !errors.As(err, &re) || re.Code != CodeInvalidInput || !validReason(re.Reason) {
				t.Fatalf("error %v is not an INVALID_INPUT refusal", err)
			}
			return
		}
		if len(b) > MaxBody || !utf8.Valid(b) || op.Kind == KindTerminal || !validID("op_", 26, op.ID) {
			t.Fatalf("accepted %q", b)
		}
		if op.Approval != "" && !validID("apr_", 20, op.Approval) {
			t.Fatalf("accepted approval %q", op.Approval)
		}
		env, _ := json.Marshal(map[string]any{"op_id": op.ID, "kind": op.Kind, "args": json.RawMessage(op.Canonical)})
		again, err := Decode(env)
		if err != nil {
			t.Fatalf("canonical %s does not decode: %v", op.Canonical, err)
		}
		if string(again.Canonical) != string(op.Canonical) {
			t.Fatalf("canonical not stable: %s then %s", op.Canonical, again.Canonical)
		}
	})
}
