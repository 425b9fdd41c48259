package attestation

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"
)

// testCert returns a small self-signed certificate's DER.
func testCert(t testing.TB) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "n"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<31, 0)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// TestParseIsStrict: a file round-trips through Encode and Parse, and
// every deviation from its one shape is refused.
func TestParseIsStrict(t *testing.T) {
	der := testCert(t)
	good := Encode([]byte("body"), []byte("sig"), [][]byte{der})
	f, err := Parse(good)
	if err != nil || string(f.Body) != "body" || string(f.Signature) != "sig" || len(f.Chain) != 1 {
		t.Fatalf("round trip: %+v %v", f, err)
	}
	for name, data := range map[string][]byte{
		"empty":          nil,
		"no signature":   Encode([]byte("body"), nil, [][]byte{der}),
		"no certificate": Encode([]byte("body"), []byte("sig"), nil),
		"swapped":        append(Encode(nil, nil, [][]byte{der}), good...),
		"trailing data":  append(bytes.Clone(good), "junk"...),
		"too many certs": Encode([]byte("body"), []byte("sig"), [][]byte{der, der, der, der, der}),
		"bad cert":       Encode([]byte("body"), []byte("sig"), [][]byte{[]byte("not der")}),
		"headers":        bytes.Replace(good, []byte("-----BEGIN BC SIGNED UPDATE-----\n"), []byte("-----BEGIN BC SIGNED UPDATE-----\nProc-Type: 4,ENCRYPTED\n\n"), 1),
		"too large":      make([]byte, MaxFileBytes+1),
	} {
		if _, err := Parse(data); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

// FuzzParse feeds untrusted attestation files to Parse: it never panics,
// and what it accepts encodes back to a file it parses the same way.
func FuzzParse(f *testing.F) {
	der := testCert(f)
	f.Add(Encode([]byte("body"), []byte("sig"), [][]byte{der}))
	f.Add(Encode([]byte{0x0a, 0x02, 'c', '1'}, []byte{0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01}, [][]byte{der, der}))
	f.Add([]byte("-----BEGIN BC SIGNED UPDATE-----\n-----END BC SIGNED UPDATE-----\n"))
	f.Add([]byte("not a pem file"))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := Parse(data)
		if err != nil {
			return
		}
		chain := make([][]byte, len(a.Chain))
		for i, c := range a.Chain {
			chain[i] = c.Raw
		}
		b, err := Parse(Encode(a.Body, a.Signature, chain))
		if err != nil {
			t.Fatalf("re-encoded file does not parse: %v", err)
		}
		if !bytes.Equal(a.Body, b.Body) || !bytes.Equal(a.Signature, b.Signature) || len(a.Chain) != len(b.Chain) {
			t.Fatal("re-encoded file differs")
		}
	})
}
