package previewtoken

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestKeyIDAndSeedRoundTrip(t *testing.T) {
	k, err := GenerateKey(bytes.NewReader(seedA))
	if err != nil {
		t.Fatal(err)
	}
	pub := ed25519.NewKeyFromSeed(seedA).Public().(ed25519.PublicKey)
	sum := sha256.Sum256(pub)
	if k.ID() != hex.EncodeToString(sum[:8]) || len(k.ID()) != kidLen {
		t.Fatalf("kid %q, want first 8 bytes of sha256(pub) in hex", k.ID())
	}
	if !bytes.Equal(k.PublicKey(), pub) {
		t.Fatal("public key differs")
	}
	seed := k.MarshalSeed()
	if !bytes.Equal(seed, seedA) {
		t.Fatal("MarshalSeed is not the seed")
	}
	k2, err := KeyFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	seed[0] ^= 0xff // the caller's copy is its own
	c := testClaims()
	if mustIssue(t, k, c) != mustIssue(t, k2, c) || k2.ID() != k.ID() {
		t.Fatal("key from its marshalled seed signs differently")
	}
	for _, n := range []int{0, 31, 33, 64} {
		if _, err := KeyFromSeed(make([]byte, n)); !errors.Is(err, ErrBadSeed) {
			t.Fatalf("seed of %d bytes: %v", n, err)
		}
	}
	if _, err := GenerateKey(bytes.NewReader(seedA[:10])); err == nil {
		t.Fatal("short randomness accepted")
	}
	if (Key{}).MarshalSeed() != nil || (Key{}).PublicKey() != nil {
		t.Fatal("zero key has material")
	}
}

// secretForms are renderings of the private key a leak could take.
func secretForms(k Key) []string {
	seed, priv := k.MarshalSeed(), []byte(k.priv)
	var forms []string
	for _, b := range [][]byte{seed, priv} {
		forms = append(forms,
			hex.EncodeToString(b), strings.ToUpper(hex.EncodeToString(b)),
			base64.StdEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b),
			strings.Trim(fmt.Sprint(b), "[]"), string(b[:8]))
	}
	return forms
}

// TestKeyNeverPrints: no fmt verb, slog, JSON or error text shows any
// rendering of the private key.
func TestKeyNeverPrints(t *testing.T) {
	k := mustKey(t, seedA)
	type holder struct {
		K   Key
		Ptr *Key
	}
	var outs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%d", "%x", "%X", "%q", "%o", "%b", "%T %v"} {
		outs = append(outs, fmt.Sprintf(verb, k), fmt.Sprintf(verb, &k), fmt.Sprintf(verb, holder{k, &k}), fmt.Sprintf(verb, []Key{k}))
	}
	outs = append(outs, fmt.Sprint(k), fmt.Sprintln(k), k.String(), k.GoString())
	var logged, jsonLogged bytes.Buffer
	slog.New(slog.NewJSONHandler(&jsonLogged, nil)).Info("key", "key", k, "ptr", &k)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("key", "key", k, "holder", holder{k, &k})
	outs = append(outs, logged.String(), jsonLogged.String())
	j, _ := json.Marshal(holder{k, &k})
	outs = append(outs, string(j))
	v := mustVerifier(t, k)
	c := testClaims()
	tok := mustIssue(t, k, c)
	for _, bad := range []string{tok + "x", replaceAt(tok, len(tok)-5, otherB64(tok[len(tok)-5])), tok} {
		_, err := v.Verify(bad, now0, "other", 1)
		if err == nil {
			t.Fatal("accepted")
		}
		if strings.Contains(err.Error(), tok[:len(tok)-10]) {
			t.Fatalf("error text %q holds the token", err)
		}
		outs = append(outs, err.Error(), fmt.Sprintf("%+v", err))
	}
	_, err := Issue(k, Claims{}, now0, maxTTL)
	outs = append(outs, err.Error())
	for _, out := range outs {
		for _, s := range secretForms(k) {
			if strings.Contains(out, s) {
				t.Fatalf("output %q holds private key material %q", out, s)
			}
		}
	}
	if !strings.Contains(fmt.Sprintf("%d", k), "REDACTED") || !strings.Contains(logged.String(), k.ID()) || !strings.Contains(jsonLogged.String(), k.ID()) {
		t.Fatal("redacted form does not name the key")
	}
}
