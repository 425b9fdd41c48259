package signing

import (
	"crypto/ed25519"
	"crypto/rand"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// TestSignable: a command of no batch is signed at once; a batched one
// only once its batch is approved.
func TestSignable(t *testing.T) {
	all := []commands.Unsigned{{ID: "c1"}, {ID: "c2", BatchID: "b1"}, {ID: "c3", BatchID: "b2"}, {ID: "c4"}, {ID: "c5", BatchID: "b3"}}
	for _, c := range []struct {
		name     string
		approved map[string]bool
		want     []string
	}{
		{"none approved", nil, []string{"c1", "c4"}},
		{"b1 approved", map[string]bool{"b1": true, "b2": false}, []string{"c1", "c2", "c4"}},
		{"all approved", map[string]bool{"b1": true, "b2": true, "b3": true}, []string{"c1", "c2", "c3", "c4", "c5"}},
	} {
		var got []string
		for _, u := range signable(all, c.approved) {
			got = append(got, u.ID)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestSignAll: every body names its command (batch included) and the
// issue time, carries a fresh nonce, and its signature verifies under the
// command context only.
func TestSignAll(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_800_000_000_123)
	todo := []commands.Unsigned{
		{ID: "c1", NodeID: "n1", Kind: "diag.run", Payload: []byte(`{}`), ExpiresAtMs: 5},
		{ID: "c2", NodeID: "n2", Kind: "disk.wipe", Payload: []byte(`{"d":1}`), ExpiresAtMs: 6, BatchID: "b1"},
	}
	sigs, err := signAll(key, todo, now)
	if err != nil || len(sigs) != len(todo) {
		t.Fatalf("signAll: %d %v", len(sigs), err)
	}
	nonces := map[string]bool{}
	for i, s := range sigs {
		var b nodev1.CommandBody
		if err := proto.Unmarshal(s.Body, &b); err != nil {
			t.Fatal(err)
		}
		u := todo[i]
		if s.CommandID != u.ID || b.CommandId != u.ID || b.NodeId != u.NodeID || b.Kind != u.Kind || string(b.Payload) != string(u.Payload) ||
			b.ExpiresAtMs != u.ExpiresAtMs || b.BatchId != u.BatchID || b.IssuedAtMs != now.UnixMilli() || b.Nonce == "" || nonces[b.Nonce] {
			t.Errorf("%s: body %v", u.ID, &b)
		}
		nonces[b.Nonce] = true
		if !ed25519.Verify(pub, append([]byte(wire.CommandSigContext), s.Body...), s.Sig) {
			t.Errorf("%s: signature does not verify", u.ID)
		}
		if ed25519.Verify(pub, append([]byte(wire.TimeSigContext), s.Body...), s.Sig) {
			t.Errorf("%s: signature verifies under the time context", u.ID)
		}
	}
}
