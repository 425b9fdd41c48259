package wgtun

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// FuzzParseKey: keys arrive from pairing files and the control plane's
// database. ParseKey never panics, accepts only the canonical form (what
// String writes back), and its error never repeats the input.
func FuzzParseKey(f *testing.F) {
	f.Add("xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=")
	f.Add("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB=")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey(s)
		if err != nil {
			if len(s) > 8 && strings.Contains(err.Error(), s) {
				t.Fatalf("error repeats the input: %v", err)
			}
			return
		}
		if k.String() != s {
			t.Fatalf("accepted %q, which is not canonical (%q)", s, k.String())
		}
	})
}

// FuzzCheckScoped: a peer's allowed address and endpoint arrive as text in
// pairing files. Whatever CheckScoped accepts is exactly one unicast
// address, and the device configuration written for it names that one
// address and nothing wider.
func FuzzCheckScoped(f *testing.F) {
	f.Add("100.100.0.2/32", "127.0.0.1:51820", int64(25))
	f.Add("100.100.0.0/24", "", int64(0))
	f.Add("::/0", "[::1]:1", int64(-1))
	f.Add("::ffff:100.100.0.2/128", "", int64(0))
	f.Fuzz(func(t *testing.T, prefix, endpoint string, keepaliveSec int64) {
		pfx, err := netip.ParsePrefix(prefix)
		if err != nil {
			return
		}
		ep, _ := netip.ParseAddrPort(endpoint)
		p := Peer{PublicKey: Key{1}, AllowedIP: pfx, Endpoint: ep, Keepalive: time.Duration(keepaliveSec) * time.Second}
		if CheckScoped(p) != nil {
			return
		}
		a := pfx.Addr()
		if pfx.Bits() != a.BitLen() || a.IsUnspecified() || a.Is4In6() || a.IsMulticast() {
			t.Fatalf("accepted %v", pfx)
		}
		lines := strings.Split(peerConfig(p), "\n")
		var allowed []string
		for _, l := range lines {
			if v, ok := strings.CutPrefix(l, "allowed_ip="); ok {
				allowed = append(allowed, v)
			}
		}
		if len(allowed) != 1 || netip.MustParsePrefix(allowed[0]) != pfx {
			t.Fatalf("device config for %v allows %v", pfx, allowed)
		}
	})
}
