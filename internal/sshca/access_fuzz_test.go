package sshca

import (
	"bytes"
	"testing"
)

// FuzzDecodeAccess: arbitrary bytes as an ssh.access payload never panic
// the decoder, and whatever it accepts re-encodes to a payload that
// decodes to the same state with a KRL that marshals.
func FuzzDecodeAccess(f *testing.F) {
	f.Add([]byte(`{"generation":1,"node_id":"n1","ca":"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl","accounts":["root"],"revoked":[5],"issued_at":1}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"generation":1,"node_id":"n1","ca":"x","accounts":[],"revoked":[0],"issued_at":-1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, ca, err := DecodeAccess(b)
		if err != nil {
			return
		}
		again, err := a.Marshal()
		if err != nil {
			t.Fatalf("accepted but does not re-encode: %v", err)
		}
		b2, ca2, err := DecodeAccess(again)
		if err != nil || b2.Generation != a.Generation || !bytes.Equal(ca.Marshal(), ca2.Marshal()) {
			t.Fatalf("re-decode: %v", err)
		}
		if _, err := a.KRL(ca).Marshal(); err != nil {
			t.Fatalf("accepted state's KRL: %v", err)
		}
	})
}
