package hosthelper

import (
	"encoding/json"
	"testing"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// FuzzDecode feeds the request decoder arbitrary bytes: it must never
// panic, must refuse with a contract code, and what it accepts must be
// version 1, a contract op, and survive a re-encode and decode unchanged.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"version":1,"op":"ping"}`))
	f.Add([]byte("{\"version\":1,\"op\":\"ping\"}\n"))
	f.Add([]byte(`{"version":1,"op":"file.write","args":{"kind":"ssh-ca","id":"a","data":"AA=="}}`))
	f.Add([]byte(`{"version":1,"op":"ping","extra":1}`))
	f.Add([]byte(`{"version":1,"OP":"ping"}`))
	f.Add([]byte(`{"version":1,"op":"ping"} `))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, ref := Decode(b)
		if (req == nil) == (ref == nil) {
			t.Fatalf("Decode(%q) = %v, %v: want exactly one", b, req, ref)
		}
		if ref != nil {
			switch ref.Code {
			case helperwire.CodeMalformed, helperwire.CodeVersion, helperwire.CodeUnknownOp, helperwire.CodeTooLarge:
			default:
				t.Fatalf("Decode(%q): code %q", b, ref.Code)
			}
			return
		}
		if req.Version != helperwire.Version || !knownOp(req.Op) {
			t.Fatalf("Decode(%q) accepted %+v", b, req)
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		req2, ref2 := Decode(again)
		if ref2 != nil || req2.Op != req.Op || string(req2.Intent) != string(req.Intent) {
			t.Fatalf("re-encoded %q: %+v %v", again, req2, ref2)
		}
	})
}
