package wgtun

import (
	"encoding/hex"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// RFC 7748 section 6.1: Alice's private and public X25519 keys.
func TestPublicMatchesRFC7748(t *testing.T) {
	var priv Key
	b, _ := hex.DecodeString("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
	copy(priv[:], b)
	if got := priv.Public().hex(); got != "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a" {
		t.Fatalf("Public = %s", got)
	}
}

func TestGenerateKeyIsClampedAndFresh(t *testing.T) {
	a, b := mustKey(t), mustKey(t)
	if a == b || a.IsZero() {
		t.Fatal("two generated keys are equal or zero")
	}
	if a[0]&7 != 0 || a[31]&128 != 0 || a[31]&64 == 0 {
		t.Fatalf("key is not clamped: first byte %#x, last %#x", a[0], a[31])
	}
	if a.Public() == a || a.Public().IsZero() {
		t.Fatal("public key is the private key or zero")
	}
}

func TestParseKeyRoundTripAndRefusals(t *testing.T) {
	k := mustKey(t)
	got, err := ParseKey(k.String())
	if err != nil || got != k {
		t.Fatalf("ParseKey(String()) = %v, %v", got, err)
	}
	s := k.String()
	for _, bad := range []string{
		"", s[:43], s + "=", strings.ReplaceAll(strings.ReplaceAll(s, "+", "-"), "/", "_") + "x",
		"!" + s[1:],
		"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB=", // non-zero padding bits: not canonical
		k.hex(),
	} {
		if _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		} else if len(bad) > 8 && strings.Contains(err.Error(), bad) {
			t.Errorf("ParseKey error repeats its input: %v", err)
		}
	}
}

// A key given to slog is logged as a fingerprint, never as the key.
func TestKeyLogValueRedacts(t *testing.T) {
	k := mustKey(t)
	var logs logBuffer
	debugLogger(&logs).Info("key", "k", k, "peer", Peer{PublicKey: k.Public(), AllowedIP: single(cpAddr)})
	out := logs.String()
	if strings.Contains(out, k.String()) || strings.Contains(out, k.hex()) {
		t.Fatalf("private key logged: %s", out)
	}
	if !strings.Contains(out, k.Fingerprint()) {
		t.Fatalf("fingerprint missing: %s", out)
	}
	if _, ok := any(k).(slog.LogValuer); !ok {
		t.Fatal("Key is not a slog.LogValuer")
	}
}

// Nothing the tunnel or the device logs, at Debug, through a whole
// session (up, traffic, add, remove, close), holds a private key.
func TestNoPrivateKeyInLogs(t *testing.T) {
	var logs logBuffer
	p := newPair(t, debugLogger(&logs))
	ln, err := p.bastion.ListenTCP(11434)
	if err != nil {
		t.Fatal(err)
	}
	go serveEcho(ln, nil)
	c, err := p.cp.DialContext(dialCtx(t, 10*time.Second), "tcp", "100.100.0.2:11434")
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("ping"))
	_, _ = p.cp.LastHandshake(p.bastionKey.Public())
	_ = p.cp.RemovePeer(p.bastionKey.Public())
	_ = p.cp.AddPeer(Peer{PublicKey: p.bastionKey.Public(), AllowedIP: single(bastionAddr)})
	p.cp.Close()
	p.bastion.Close()
	out := logs.String()
	if !strings.Contains(out, "wireguard device") {
		t.Fatal("the device logged nothing at Debug; the test would prove nothing")
	}
	for _, k := range []Key{p.cpKey, p.bastionKey} {
		for _, form := range []string{k.String(), k.hex(), strings.ToUpper(k.hex())} {
			if strings.Contains(out, form) {
				t.Fatalf("a private key is in the logs")
			}
		}
	}
}
