package pki

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBreakGlassCA: a new bundle has a break-glass SSH CA, sealed like the
// other keys (its private half opens only under the KEK and is nowhere in
// the clear); a bundle made before it existed loads without one, and
// EnsureBreakGlassCA adds one once (a second call keeps it), refusing a
// KEK that does not open the bundle.
func TestBreakGlassCA(t *testing.T) {
	b, kek, dir := newBundle(t)
	k, err := b.BreakGlassCAKey(kek)
	if err != nil {
		t.Fatalf("unseal: %v", err)
	}
	if _, err := b.BreakGlassCAKey(testKEK(8)); err == nil {
		t.Fatal("the break-glass CA key opened under another KEK")
	}
	raw, _ := os.ReadFile(filepath.Join(dir, BundleFile))
	if bytes.Contains(raw, k.Seed()) || bytes.Contains(raw, []byte(b64(k.Seed()))) {
		t.Fatal("the break-glass CA's private key is in the bundle unsealed")
	}
	if !strings.HasPrefix(b.Show().BreakGlassCA, "ssh-ed25519 ") {
		t.Fatalf("show: %q", b.Show().BreakGlassCA)
	}

	// An older bundle: no break_glass_ssh_ca and no sealed slot.
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "break_glass_ssh_ca")
	delete(m["sealed"].(map[string]any), keyBreakGlass)
	old, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dir, BundleFile), old, 0o600); err != nil {
		t.Fatal(err)
	}
	ob, err := Load(dir)
	if err != nil || ob.BreakGlassCA != nil {
		t.Fatalf("an older bundle: %v %v", ob, err)
	}
	if _, err := ob.BreakGlassCAKey(kek); err == nil {
		t.Fatal("a bundle without a break-glass CA unsealed one")
	}
	if _, added, err := EnsureBreakGlassCA(dir, testKEK(8)); err == nil || added {
		t.Fatalf("a wrong KEK: %v %v", added, err)
	}
	nb, added, err := EnsureBreakGlassCA(dir, kek)
	if err != nil || !added || nb.BreakGlassCA == nil || bytes.Equal(nb.BreakGlassCA, b.BreakGlassCA) {
		t.Fatalf("ensure: %v %v", added, err)
	}
	again, added, err := EnsureBreakGlassCA(dir, kek)
	if err != nil || added || !bytes.Equal(again.BreakGlassCA, nb.BreakGlassCA) {
		t.Fatalf("ensure again: %v %v", added, err)
	}
	if _, err := again.BreakGlassCAKey(kek); err != nil {
		t.Fatalf("unseal the added key: %v", err)
	}
}
