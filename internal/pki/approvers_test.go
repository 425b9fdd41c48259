package pki

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func approverKeys(t *testing.T, n int) []ed25519.PublicKey {
	t.Helper()
	out := make([]ed25519.PublicKey, n)
	for i := range out {
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = pub
	}
	return out
}

// TestPinApprovers: approvers are pinned once into the bundle on disk, come
// back on Load, travel in the join-key-signed trust bundle, and cannot be
// replaced by pinning again.
func TestPinApprovers(t *testing.T) {
	b, kek, dir := newBundle(t)
	if len(b.TrustBundle(t0).Approvers) != 0 || b.TrustBundle(t0).Threshold != 0 {
		t.Fatal("a fresh bundle pins approvers")
	}
	keys := approverKeys(t, 3)
	if _, err := PinApprovers(dir, keys, 0); err == nil || err.Error() != "pki: approver threshold must be 1..3" {
		t.Fatalf("threshold 0: %v", err)
	}
	if _, err := PinApprovers(dir, keys, 4); err == nil || err.Error() != "pki: approver threshold must be 1..3" {
		t.Fatalf("threshold 4: %v", err)
	}
	if _, err := PinApprovers(dir, []ed25519.PublicKey{keys[0], keys[0]}, 1); err == nil || err.Error() != "pki: approver key listed twice" {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := PinApprovers(dir, []ed25519.PublicKey{keys[0][:31]}, 1); err == nil || err.Error() != "pki: approver key is not a 32-byte Ed25519 key" {
		t.Fatalf("short key: %v", err)
	}
	if _, err := PinApprovers(dir, approverKeys(t, MaxApprovers+1), 1); err == nil || err.Error() != "pki: at most 32 approvers" {
		t.Fatalf("33 keys: %v", err)
	}
	if _, err := PinApprovers(dir, nil, 0); err == nil || err.Error() != "pki: no approver keys to pin" {
		t.Fatalf("no keys: %v", err)
	}
	if fresh, err := Load(dir); err != nil || len(fresh.Approvers) != 0 || fresh.Threshold != 0 {
		t.Fatalf("a refused pin changed the bundle: %v", err)
	}
	// 32 keys is the most a bundle pins (checked on a copy of the bundle).
	_, _, maxDir := newBundle(t)
	if b32, err := PinApprovers(maxDir, approverKeys(t, MaxApprovers), MaxApprovers); err != nil || len(b32.Approvers) != 32 {
		t.Fatalf("32 keys: %v", err)
	}
	if _, err := PinApprovers(dir, keys, 2); err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(loaded.Approvers, keys) || loaded.Threshold != 2 {
		t.Fatalf("loaded approvers %v threshold %d", loaded.Approvers, loaded.Threshold)
	}
	if _, err := loaded.JoinSigningKey(kek); err != nil {
		t.Fatalf("sealed keys lost by pinning: %v", err)
	}
	if _, err := PinApprovers(dir, approverKeys(t, 3), 1); !errors.Is(err, ErrApproversPinned) {
		t.Fatalf("second pin: %v", err)
	}
	if again, err := Load(dir); err != nil || !reflect.DeepEqual(again.Approvers, keys) || again.Threshold != 2 {
		t.Fatalf("a refused second pin replaced the approvers: %v", err)
	}
	body, err := EncodeTrustBundle(loaded.TrustBundle(t0))
	if err != nil {
		t.Fatal(err)
	}
	want := `"approvers":["` + base64.StdEncoding.EncodeToString(keys[0]) + `","` + base64.StdEncoding.EncodeToString(keys[1]) + `","` +
		base64.StdEncoding.EncodeToString(keys[2]) + `"],"threshold":2}`
	if !strings.HasSuffix(string(body), want) {
		t.Fatalf("encoding %s does not end with %s", body, want)
	}
	tb, err := DecodeTrustBundle(body)
	if err != nil || tb.Threshold != 2 || len(tb.Approvers) != 3 {
		t.Fatalf("decode: %+v %v", tb, err)
	}
	if show := loaded.Show(); show.Threshold != 2 || len(show.Approvers) != 3 || !strings.Contains(show.String(), "2 of 3 must sign") {
		t.Fatalf("show: %+v", show)
	}
}

// TestDecodeTrustBundleApproversStrict: the approver part of a trust bundle
// is decoded as strictly as the rest.
func TestDecodeTrustBundleApproversStrict(t *testing.T) {
	_, _, dir := newBundle(t)
	keys := approverKeys(t, 2)
	if _, err := PinApprovers(dir, keys, 2); err != nil {
		t.Fatal(err)
	}
	b, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	body, err := EncodeTrustBundle(b.TrustBundle(t0))
	if err != nil {
		t.Fatal(err)
	}
	s := string(body)
	k0, k1 := base64.StdEncoding.EncodeToString(keys[0]), base64.StdEncoding.EncodeToString(keys[1])
	short := base64.StdEncoding.EncodeToString(keys[0][:31])
	tests := []struct{ name, data, want string }{
		{"threshold above count", strings.Replace(s, `"threshold":2`, `"threshold":3`, 1), "pki: trust bundle: pki: approver threshold must be 1..2"},
		{"threshold zero", strings.Replace(s, `,"threshold":2`, ``, 1), "pki: trust bundle: pki: approver threshold must be 1..2"},
		{"threshold negative", strings.Replace(s, `"threshold":2`, `"threshold":-1`, 1), "pki: trust bundle: pki: approver threshold must be 1..2"},
		{"duplicate approver", strings.Replace(s, k1, k0, 1), "pki: trust bundle: pki: approver key listed twice"},
		{"short approver key", strings.Replace(s, k1, short, 1), "pki: trust bundle: pki: approver key is not a 32-byte Ed25519 key"},
		{"threshold without approvers", strings.Replace(s, `"approvers":["`+k0+`","`+k1+`"],`, ``, 1), "pki: trust bundle: pki: approver threshold without approvers"},
		{"empty approver list", strings.Replace(s, `"approvers":["`+k0+`","`+k1+`"],"threshold":2`, `"approvers":[]`, 1), "pki: trust bundle is not canonically encoded"},
		{"null approvers", strings.Replace(s, `"approvers":["`+k0+`","`+k1+`"],"threshold":2`, `"approvers":null`, 1), "pki: trust bundle is not canonically encoded"},
		{"explicit zero threshold", strings.Replace(s, `"approvers":["`+k0+`","`+k1+`"],"threshold":2`, `"threshold":0`, 1), "pki: trust bundle is not canonically encoded"},
	}
	// More than 32 approvers: a bundle the encoder would never make.
	many := b.TrustBundle(t0)
	many.Approvers, many.Threshold = approverBytes(approverKeys(t, MaxApprovers+1)), 1
	manyJSON, err := json.Marshal(many)
	if err != nil {
		t.Fatal(err)
	}
	tests = append(tests, struct{ name, data, want string }{"33 approvers", string(manyJSON), "pki: trust bundle: pki: at most 32 approvers"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeTrustBundle([]byte(tt.data))
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}
