package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// fixedClock is a clock stopped at t.
func fixedClock(t time.Time) clock.Clock { return clock.NewFake(t) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const td = "dev.bc.local"

func newBundle(t testing.TB) (*Bundle, KEK, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	kek := testKEK(7)
	b, err := Init(dir, td, kek, fixedClock(t0))
	if err != nil {
		t.Fatal(err)
	}
	return b, kek, dir
}

// privateSecrets unseals every key in b and returns its raw private bytes
// (ECDSA D, Ed25519 seed) by name.
func privateSecrets(t *testing.T, b *Bundle, kek KEK) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for name, f := range map[string]func(KEK) (*ecdsa.PrivateKey, error){"node-ca": b.NodeCAKey, "internal-ca": b.InternalCAKey} {
		k, err := f(kek)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		d, err := k.Bytes()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = d
	}
	for name, f := range map[string]func(KEK) (ed25519.PrivateKey, error){"command-root": b.CommandRootKey, "join-key": b.JoinSigningKey, "audit-key": b.AuditSigningKey, "break-glass-ssh-ca": b.BreakGlassCAKey} {
		k, err := f(kek)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = k.Seed()
	}
	return out
}

// encodings returns the textual forms a raw secret could take in a file:
// raw, hex, and base64 windows at every 3-byte alignment.
func encodings(raw []byte) [][]byte {
	out := [][]byte{raw, []byte(hex.EncodeToString(raw)), []byte(strings.ToUpper(hex.EncodeToString(raw)))}
	for shift, start := range []int{0, 2, 3} {
		padded := append(make([]byte, shift), raw...)
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			s := enc.EncodeToString(padded)
			out = append(out, []byte(s[start:start+32]))
		}
	}
	return out
}

// decodedForms walks all JSON strings in data and returns every base64, hex
// and PEM decoding of them, so secrets nested in encodings are found too.
func decodedForms(t *testing.T, data []byte) [][]byte {
	t.Helper()
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(k)
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		case string:
			out = append(out, []byte(x))
			if b, err := base64.StdEncoding.DecodeString(x); err == nil {
				out = append(out, b)
			}
			if b, err := hex.DecodeString(x); err == nil {
				out = append(out, b)
			}
			rest := []byte(x)
			for {
				var blk *pem.Block
				if blk, rest = pem.Decode(rest); blk == nil {
					break
				}
				out = append(out, blk.Bytes)
			}
		}
	}
	walk(v)
	return out
}

func assertNoSecrets(t *testing.T, what string, data []byte, secrets map[string][]byte) {
	t.Helper()
	if bytes.Contains(data, []byte("PRIVATE KEY")) {
		t.Fatalf("%s contains a PRIVATE KEY block", what)
	}
	hay := append([][]byte{data}, decodedForms(t, data)...)
	for name, raw := range secrets {
		for _, needle := range encodings(raw) {
			for _, h := range hay {
				if bytes.Contains(h, needle) {
					t.Fatalf("%s contains the private key %s", what, name)
				}
			}
		}
	}
}

// TestBundleStoresNoUnsealedKey is the control "No private key of the control
// plane's PKI is stored unsealed".
func TestBundleStoresNoUnsealedKey(t *testing.T) {
	b, kek, dir := newBundle(t)
	data, err := os.ReadFile(filepath.Join(dir, BundleFile))
	if err != nil {
		t.Fatal(err)
	}
	secrets := privateSecrets(t, b, kek)
	if len(secrets) != 6 {
		t.Fatalf("got %d secrets", len(secrets))
	}
	// The checker must itself be able to find a planted secret.
	for name, raw := range secrets {
		planted := []byte(`{"x":"` + base64.StdEncoding.EncodeToString(append([]byte{9}, raw...)) + `"}`)
		hay := append([][]byte{planted}, decodedForms(t, planted)...)
		found := false
		for _, needle := range encodings(raw) {
			for _, h := range hay {
				found = found || bytes.Contains(h, needle)
			}
		}
		if !found {
			t.Fatalf("checker misses a planted %s", name)
		}
	}
	assertNoSecrets(t, "bundle.json", data, secrets)
	loaded, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	assertNoSecrets(t, "bundle.json (loaded)", data, privateSecrets(t, loaded, kek))
}

// TestShowPrintsNoPrivateKey is the control "pki show prints none".
func TestShowPrintsNoPrivateKey(t *testing.T) {
	b, kek, dir := newBundle(t)
	loaded, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	secrets := privateSecrets(t, b, kek)
	for _, bb := range []*Bundle{b, loaded} {
		js, err := json.Marshal(bb.Show())
		if err != nil {
			t.Fatal(err)
		}
		assertNoSecrets(t, "Show JSON", js, secrets)
		text := bb.Show().String()
		textJSON, _ := json.Marshal(map[string]string{"text": text})
		assertNoSecrets(t, "Show text", textJSON, secrets)
		for name, sealed := range bb.sealed {
			if bytes.Contains(js, []byte(base64.StdEncoding.EncodeToString(sealed))) || strings.Contains(text, base64.StdEncoding.EncodeToString(sealed)) {
				t.Fatalf("Show prints sealed %s", name)
			}
		}
	}
}

func TestShowContent(t *testing.T) {
	b, _, _ := newBundle(t)
	s := b.Show()
	js, _ := json.Marshal(s)
	for _, key := range []string{`"trust_domain":"dev.bc.local"`, `"deployment":"dev.bc.local"`, `"node_ca":{"subject":`, `"sha256_fingerprint":`, `"spki_pin":`, `"not_after":"2036-03-01T12:00:00Z"`, `"join_key":"` + base64.StdEncoding.EncodeToString(b.JoinKey) + `"`} {
		if !bytes.Contains(js, []byte(key)) {
			t.Errorf("Show JSON lacks %s", key)
		}
	}
	pin := JoinKeyPin(b.JoinKey)
	if s.JoinKeyPin != hex.EncodeToString(pin[:]) || s.NodeCA.Serial != b.NodeCA.SerialNumber.Text(16) {
		t.Error("Show pin or serial wrong")
	}
	if !strings.Contains(s.String(), "join key pin: "+s.JoinKeyPin) || !strings.Contains(s.String(), "-----BEGIN CERTIFICATE-----") {
		t.Errorf("String() = %s", s.String())
	}
}

func TestInitLoadRoundTrip(t *testing.T) {
	b, kek, dir := newBundle(t)
	fi, err := os.Stat(filepath.Join(dir, BundleFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("bundle.json mode = %v, %v", fi.Mode(), err)
	}
	if di, _ := os.Stat(dir); di.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode = %v", di.Mode())
	}
	l, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if l.TrustDomain != td || l.Deployment != td || !l.NodeCA.Equal(b.NodeCA) || !l.InternalCA.Equal(b.InternalCA) ||
		!l.CommandRoot.Equal(b.CommandRoot) || !l.JoinKey.Equal(b.JoinKey) || !l.AuditKey.Equal(b.AuditKey) {
		t.Fatal("loaded bundle differs")
	}
	if !b.NodeCA.NotAfter.Equal(t0.AddDate(10, 0, 0)) || !b.NodeCA.IsCA || b.NodeCA.MaxPathLen != 0 {
		t.Fatalf("node CA: %v %v", b.NodeCA.NotAfter, b.NodeCA.IsCA)
	}
	if _, ok := b.CommandRoot.PublicKey.(ed25519.PublicKey); !ok {
		t.Fatal("command root is not Ed25519")
	}
	want, got := privateSecrets(t, b, kek), privateSecrets(t, l, kek)
	for name := range want {
		if !bytes.Equal(want[name], got[name]) {
			t.Fatalf("%s differs after Load", name)
		}
	}
	if _, err := Init(dir, td, kek, fixedClock(t0)); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second Init err = %v", err)
	}
}

func TestUnsealRefusals(t *testing.T) {
	b, kek, dir := newBundle(t)
	wrong := testKEK(99)
	for name, f := range map[string]func(KEK) error{
		"node-ca":      func(k KEK) error { _, err := b.NodeCAKey(k); return err },
		"internal-ca":  func(k KEK) error { _, err := b.InternalCAKey(k); return err },
		"command-root": func(k KEK) error { _, err := b.CommandRootKey(k); return err },
		"join-key":     func(k KEK) error { _, err := b.JoinSigningKey(k); return err },
		"audit-key":    func(k KEK) error { _, err := b.AuditSigningKey(k); return err },
	} {
		if err := f(wrong); !errors.Is(err, ErrSealBroken) {
			t.Errorf("%s with wrong KEK: %v", name, err)
		}
	}
	// A sealed blob moved to another slot is refused by the aad.
	path := filepath.Join(dir, BundleFile)
	var raw map[string]any
	data, _ := os.ReadFile(path)
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	sealed := raw["sealed"].(map[string]any)
	sealed["node-ca"], sealed["internal-ca"] = sealed["internal-ca"], sealed["node-ca"]
	data, _ = json.Marshal(raw)
	if err := WriteFileAtomic(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.NodeCAKey(kek); !errors.Is(err, ErrSealBroken) || err.Error() != "pki: unseal node-ca: pki: open: pki: sealed data does not open" {
		t.Fatalf("swapped slot: %v", err)
	}
	// A key from another bundle sealed in the right slot is refused by the key match.
	other, _, otherDir := newBundle(t)
	_ = other
	od, _ := os.ReadFile(filepath.Join(otherDir, BundleFile))
	var oraw map[string]any
	json.Unmarshal(od, &oraw)
	sealed["node-ca"] = oraw["sealed"].(map[string]any)["node-ca"]
	sealed["internal-ca"] = oraw["sealed"].(map[string]any)["internal-ca"]
	data, _ = json.Marshal(raw)
	WriteFileAtomic(path, data, 0o600)
	l, err = Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.NodeCAKey(kek); !errors.Is(err, ErrSealBroken) || err.Error() != "pki: unseal node-ca: key does not match its public half: pki: sealed data does not open" {
		t.Fatalf("foreign key: %v", err)
	}
}

func TestInitRefusals(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, td string
		kek      KEK
		clk      Clock
		want     string
	}{
		{"uppercase td", "Dev.bc.local", testKEK(1), fixedClock(t0), `pki: trust domain "Dev.bc.local": only [a-z0-9.-] allowed`},
		{"empty td", "", testKEK(1), fixedClock(t0), "pki: trust domain must be 1..253 characters, got 0"},
		{"empty label", "a..b", testKEK(1), fixedClock(t0), `pki: trust domain "a..b" has an empty label`},
		{"long td", strings.Repeat("a", 254), testKEK(1), fixedClock(t0), "pki: trust domain must be 1..253 characters, got 254"},
		{"zero kek", td, KEK{}, fixedClock(t0), "pki: refusing an all-zero KEK"},
		{"nil clock", td, testKEK(1), nil, "pki: nil clock"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Init(filepath.Join(dir, tt.name), tt.td, tt.kek, tt.clk)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestLoadRefusals(t *testing.T) {
	_, _, dir := newBundle(t)
	good, _ := os.ReadFile(filepath.Join(dir, BundleFile))
	mutate := func(f func(m map[string]any)) []byte {
		var m map[string]any
		json.Unmarshal(good, &m)
		f(m)
		out, _ := json.Marshal(m)
		return out
	}
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"unknown field", mutate(func(m map[string]any) { m["private_key"] = "x" }), `pki: decode %s: json: unknown field "private_key"`},
		{"version", mutate(func(m map[string]any) { m["version"] = 2 }), "pki: %s: unsupported version 2"},
		{"short join key", mutate(func(m map[string]any) { m["join_key"] = "AAAA" }), "pki: %s: join and audit keys must be 32-byte Ed25519 keys"},
		{"missing sealed", mutate(func(m map[string]any) { delete(m["sealed"].(map[string]any), "audit-key") }), "pki: %s: sealed audit-key missing"},
		{"extra sealed", mutate(func(m map[string]any) { m["sealed"].(map[string]any)["x"] = "AAAA" }), "pki: %s: unexpected sealed entries"},
		{"swapped CA types", mutate(func(m map[string]any) { m["node_ca"] = m["command_root"] }), "pki: %s: node-ca: CA has the wrong key type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := t.TempDir()
			if err := os.WriteFile(filepath.Join(d, BundleFile), tt.data, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(d)
			want := strings.Replace(tt.want, "%s", filepath.Join(d, BundleFile), 1)
			if err == nil || err.Error() != want {
				t.Fatalf("err = %v, want %q", err, want)
			}
		})
	}
	if _, err := Load(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing: %v", err)
	}
}
