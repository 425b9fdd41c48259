package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"reflect"
	"strings"
	"testing"
	"time"
)

func signedBundle(t testing.TB) (*Bundle, []byte, []byte, ed25519.PrivateKey) {
	t.Helper()
	b, kek, _ := newBundle(t)
	key, err := b.JoinSigningKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	body, err := EncodeTrustBundle(b.TrustBundle(t0))
	if err != nil {
		t.Fatal(err)
	}
	return b, body, SignTrustBundle(key, body), key
}

func TestTrustBundleSignVerify(t *testing.T) {
	b, body, sig, _ := signedBundle(t)
	tb, err := VerifyTrustBundle(body, sig, b.JoinKey, JoinKeyPin(b.JoinKey))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(tb, b.TrustBundle(t0)) || tb.IssuedAt != t0.Unix() || tb.Version != 1 {
		t.Fatalf("bundle = %+v", tb)
	}
	if !strings.HasPrefix(string(body), `{"version":1,"trust_domain":"dev.bc.local","deployment":"dev.bc.local","node_roots":["`) ||
		!strings.Contains(string(body), `"command_roots":["`+base64.StdEncoding.EncodeToString(b.CommandRoot.Raw)+`"],"issued_at":`) {
		t.Fatalf("encoding = %s", body)
	}
	again, _ := EncodeTrustBundle(tb)
	if !bytes.Equal(again, body) {
		t.Fatal("encoding is not deterministic")
	}
	if !ed25519.Verify(b.JoinKey, append([]byte("bc-trust-bundle-v1\x00"), body...), sig) {
		t.Fatal("signature is not over the documented message")
	}

	nodePool, err := tb.NodeRootPool()
	if err != nil {
		t.Fatal(err)
	}
	serverPool, err := tb.ServerRootPool()
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := tb.CommandRootCerts()
	if err != nil || len(cmd) != 1 || !cmd[0].Equal(b.CommandRoot) {
		t.Fatalf("command roots: %v", err)
	}
	if _, err := b.NodeCA.Verify(x509.VerifyOptions{Roots: nodePool, CurrentTime: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.InternalCA.Verify(x509.VerifyOptions{Roots: serverPool, CurrentTime: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.InternalCA.Verify(x509.VerifyOptions{Roots: nodePool, CurrentTime: t0}); err == nil {
		t.Fatal("internal CA in node pool")
	}
}

func TestTrustBundleRefusals(t *testing.T) {
	b, body, sig, _ := signedBundle(t)
	pin := JoinKeyPin(b.JoinKey)
	for i := range body {
		bad := bytes.Clone(body)
		bad[i] ^= 0x01
		if _, err := VerifyTrustBundle(bad, sig, b.JoinKey, pin); err == nil || err.Error() != "pki: trust bundle signature does not verify" {
			t.Fatalf("body byte %d: %v", i, err)
		}
	}
	for i := range sig {
		bad := bytes.Clone(sig)
		bad[i] ^= 0x80
		if _, err := VerifyTrustBundle(body, bad, b.JoinKey, pin); err == nil || err.Error() != "pki: trust bundle signature does not verify" {
			t.Fatalf("sig byte %d: %v", i, err)
		}
	}
	otherPub, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	wrongPin := pin
	wrongPin[0] ^= 1
	tests := []struct {
		name      string
		body, sig []byte
		pub       ed25519.PublicKey
		pin       [32]byte
		want      string
	}{
		{"wrong pin", body, sig, b.JoinKey, wrongPin, "pki: join key does not match the pin"},
		{"other key pinned to ours", body, SignTrustBundle(otherKey, body), otherPub, pin, "pki: join key does not match the pin"},
		{"other key, its own pin", body, sig, otherPub, JoinKeyPin(otherPub), "pki: trust bundle signature does not verify"},
		{"short key", body, sig, b.JoinKey[:31], pin, "pki: join key is not an Ed25519 public key"},
		{"short sig", body, sig[:63], b.JoinKey, pin, "pki: trust bundle signature does not verify"},
		{"no context prefix", body, ed25519.Sign(otherKey, body), otherPub, JoinKeyPin(otherPub), "pki: trust bundle signature does not verify"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := VerifyTrustBundle(tt.body, tt.sig, tt.pub, tt.pin)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestDecodeTrustBundleStrict(t *testing.T) {
	b, body, _, _ := signedBundle(t)
	s := string(body)
	node := base64.StdEncoding.EncodeToString(b.NodeCA.Raw)
	leafDER, _ := IssueServerCert(b.InternalCA, mustKey(t, b), td, []string{"localhost"}, nil, time.Hour, t0)
	leaf := base64.StdEncoding.EncodeToString(leafDER.Certificate[0])
	tests := []struct {
		name string
		data string
		want string
	}{
		{"unknown field", strings.Replace(s, `{"version":1,`, `{"version":1,"extra":1,`, 1), `pki: decode trust bundle: json: unknown field "extra"`},
		{"trailing data", s + `{}`, "pki: trailing data after trust bundle"},
		{"trailing garbage", s + `x`, "pki: trailing data after trust bundle"},
		{"trailing newline", s + "\n", "pki: trust bundle is not canonically encoded"},
		{"missing trust domain", strings.Replace(s, `"trust_domain":"dev.bc.local",`, "", 1), "pki: trust bundle: pki: trust domain must be 1..253 characters, got 0"},
		{"bad trust domain", strings.Replace(s, `"trust_domain":"dev.bc.local"`, `"trust_domain":"DEV"`, 1), `pki: trust bundle: pki: trust domain "DEV": only [a-z0-9.-] allowed`},
		{"empty node roots", strings.Replace(s, `"node_roots":["`+node+`"]`, `"node_roots":[]`, 1), "pki: trust bundle node_roots must hold 1..16 roots"},
		{"null node roots", strings.Replace(s, `"node_roots":["`+node+`"]`, `"node_roots":null`, 1), "pki: trust bundle node_roots must hold 1..16 roots"},
		{"leaf as root", strings.Replace(s, `"node_roots":["`+node+`"]`, `"node_roots":["`+leaf+`"]`, 1), "pki: trust bundle node_roots: root is not a CA certificate"},
		{"garbage root", strings.Replace(s, `"node_roots":["`+node+`"]`, `"node_roots":["AAAA"]`, 1), "pki: trust bundle node_roots: x509: malformed certificate"},
		{"version 2", strings.Replace(s, `"version":1`, `"version":2`, 1), "pki: trust bundle version 2 unsupported"},
		{"missing deployment", strings.Replace(s, `"deployment":"dev.bc.local",`, "", 1), "pki: trust bundle deployment must be 1..253 bytes"},
		{"duplicate key", strings.Replace(s, `{"version":1,`, `{"version":1,"version":1,`, 1), "pki: trust bundle is not canonically encoded"},
		{"case-folded key", strings.Replace(s, `"version":1`, `"VERSION":1`, 1), "pki: trust bundle is not canonically encoded"},
		{"whitespace", strings.Replace(s, `"version":1`, `"version": 1`, 1), "pki: trust bundle is not canonically encoded"},
		{"not an object", `[]`, "pki: decode trust bundle: json: cannot unmarshal array into Go value of type pki.TrustBundle"},
		{"empty", ``, "pki: decode trust bundle: EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeTrustBundle([]byte(tt.data))
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
	if _, err := EncodeTrustBundle(TrustBundle{Version: 1, TrustDomain: td, Deployment: td}); err == nil || err.Error() != "pki: trust bundle node_roots must hold 1..16 roots" {
		t.Fatalf("encode empty: %v", err)
	}
}

func mustKey(t *testing.T, b *Bundle) *ecdsa.PrivateKey {
	t.Helper()
	k, err := b.InternalCAKey(testKEK(7))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// FuzzDecodeTrustBundle checks that DecodeTrustBundle never panics and that
// anything it accepts is exactly the canonical encoding of what it decoded
// (so one signed body has one meaning), which decodes to an equal value.
func FuzzDecodeTrustBundle(f *testing.F) {
	_, body, _, _ := signedBundle(f)
	f.Add(body)
	f.Add([]byte(strings.Replace(string(body), `"version":1`, `"version": 1`, 1)))
	f.Add([]byte(strings.Replace(string(body), `"version":1`, `"version":1.0`, 1)))
	f.Add([]byte(strings.Replace(string(body), `"trust_domain"`, `"trust_Domain"`, 1)))
	f.Add([]byte(strings.Replace(string(body), `{"version":1,`, `{"version":1,"version":1,`, 1)))
	f.Add([]byte(strings.Replace(string(body), `"deployment":"dev.bc.local"`, `"deployment":"dev.bc\u002elocal"`, 1)))
	f.Add(append(bytes.Clone(body), '\n'))
	f.Fuzz(func(t *testing.T, data []byte) {
		tb, err := DecodeTrustBundle(data)
		if err != nil {
			return
		}
		enc, err := EncodeTrustBundle(tb)
		if err != nil {
			t.Fatalf("accepted bundle does not re-encode: %v", err)
		}
		if !bytes.Equal(enc, data) {
			t.Fatalf("accepted non-canonical bytes %q (canonical %q)", data, enc)
		}
		tb2, err := DecodeTrustBundle(enc)
		if err != nil {
			t.Fatalf("re-encoded bundle does not decode: %v", err)
		}
		if !reflect.DeepEqual(tb, tb2) {
			t.Fatalf("round trip changed the bundle")
		}
	})
}
