package netguard

import (
	"net/netip"
	"strings"
	"testing"
)

// The lists below are written independently of the classifier's tables
// (from the IANA registries directly) so FuzzClassify checks the classifier
// against a second reading of the rules, not against itself.
var (
	indepRefused4 = parsePrefixes(
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
		"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
		"255.255.255.255/32", "168.63.129.16/32",
	)
	// indepRefused6 holds IPv6 ranges refused whatever they embed.
	indepRefused6 = parsePrefixes(
		"::/128", "::1/128", "::/96", "::ffff:0:0:0/96", "64:ff9b:1::/48", "100::/64",
		"100:0:0:1::/64", "2001:1::1/128", "2001:1::2/128", "2001:1::3/128", "2001:2::/48",
		"2001:10::/28", "2001:20::/28", "2001:30::/28", "2001:db8::/32", "3fff::/20",
		"5f00::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
	)
	// Parts of 2001::/23 that the guard allows; the rest of the /23 but
	// Teredo is refused.
	indepAllowedIn2001 = parsePrefixes("2001::/32", "2001:3::/32", "2001:4:112::/48")
	indep2001          = netip.MustParsePrefix("2001::/23")
	indepNAT64WKP      = netip.MustParsePrefix("64:ff9b::/96")
	indepNAT64All      = netip.MustParsePrefix("64:ff9b::/32")
	indepUnicast6      = netip.MustParsePrefix("2000::/3")
	indepMapped        = netip.MustParsePrefix("::ffff:0:0/96")
)

func parsePrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func inAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// mustBeRefused says whether an independent reading of the rules refuses a,
// and why (for the failure message).
func mustBeRefused(a netip.Addr) (bool, string) {
	a = a.WithZone("")
	if a.Is4() {
		return inAny(indepRefused4, a), "IPv4 range"
	}
	b := a.As16()
	v4 := func(off int, mask byte) netip.Addr {
		return netip.AddrFrom4([4]byte{b[off] ^ mask, b[off+1] ^ mask, b[off+2] ^ mask, b[off+3] ^ mask})
	}
	switch {
	case inAny(indepRefused6, a):
		return true, "IPv6 range"
	case indepMapped.Contains(a):
		return inAny(indepRefused4, v4(12, 0)), "mapped"
	case indepNAT64WKP.Contains(a):
		return inAny(indepRefused4, v4(12, 0)), "nat64"
	case indepNAT64All.Contains(a):
		return true, "nat64 local"
	case b[0] == 0x20 && b[1] == 0x02:
		return inAny(indepRefused4, v4(2, 0)), "6to4"
	case b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0:
		return inAny(indepRefused4, v4(4, 0)) || inAny(indepRefused4, v4(12, 0xff)), "teredo"
	case indep2001.Contains(a) && !inAny(indepAllowedIn2001, a):
		return true, "2001::/23"
	case !indepUnicast6.Contains(a):
		return true, "outside 2000::/3"
	}
	return false, ""
}

var knownReasons = map[Reason]bool{
	Allowed: true, ReasonLoopback: true, ReasonUnspecified: true, ReasonLinkLocal: true,
	ReasonPrivate: true, ReasonCGNAT: true, ReasonULA: true, ReasonBenchmarking: true,
	ReasonReserved: true, ReasonMulticast: true, ReasonBroadcast: true,
	ReasonIPv4Compatible: true, ReasonIPv4Translated: true, ReasonSiteLocal: true,
	ReasonNAT64Local: true, ReasonDocumentation: true, ReasonSpecialPurpose: true,
	ReasonCloudMetadata: true,
}

// fuzzAddr builds an address from fuzz input. form picks a layout so the
// embedded-IPv4 forms are reached often: 0 IPv4, 1 raw IPv6, 2 mapped,
// 3 compatible, 4 NAT64, 5 6to4, 6 Teredo, 7 translated.
func fuzzAddr(form uint8, data []byte) netip.Addr {
	var buf [16]byte
	copy(buf[:], data)
	var b [16]byte
	switch form % 8 {
	case 0:
		return netip.AddrFrom4([4]byte(buf[:4]))
	case 1:
		return netip.AddrFrom16(buf)
	case 2:
		b[10], b[11] = 0xff, 0xff
		copy(b[12:], buf[:4])
	case 3:
		copy(b[12:], buf[:4])
	case 4:
		b[0], b[1], b[2], b[3] = 0x00, 0x64, 0xff, 0x9b
		copy(b[12:], buf[:4])
	case 5:
		b[0], b[1] = 0x20, 0x02
		copy(b[2:], buf[:14])
	case 6:
		b[0], b[1] = 0x20, 0x01
		copy(b[4:], buf[:12])
	case 7:
		b[8], b[9] = 0xff, 0xff
		copy(b[12:], buf[:4])
	}
	return netip.AddrFrom16(b)
}

// FuzzClassify checks that no address is ever both allowed and inside a
// range an independent reading of the rules refuses, that every reason is
// a known code, and that a zone never changes the verdict.
func FuzzClassify(f *testing.F) {
	f.Add(uint8(0), []byte{127, 0, 0, 1})
	f.Add(uint8(2), []byte{10, 0, 0, 1})
	f.Add(uint8(6), []byte{8, 8, 8, 8, 0, 0, 0, 0, 0xf5, 0xff, 0xff, 0xfe})
	f.Fuzz(func(t *testing.T, form uint8, data []byte) {
		a := fuzzAddr(form, data)
		got := Classify(a)
		if !knownReasons[got] {
			t.Fatalf("Classify(%s) = %q: not a known reason code", a, got)
		}
		if refuse, why := mustBeRefused(a); refuse && !got.Refused() {
			t.Fatalf("Classify(%s) allowed an address inside a refused range (%s)", a, why)
		}
		if a.Is6() {
			if z := Classify(a.WithZone("eth0")); z != got {
				t.Fatalf("Classify(%s%%eth0) = %q, without zone %q", a, z, got)
			}
		}
		// An allowed IPv6 address is global unicast or embeds an IPv4
		// address (mapped, NAT64); nothing from the reserved space.
		if !got.Refused() && a.Is6() && !indepUnicast6.Contains(a) && !indepMapped.Contains(a) && !indepNAT64WKP.Contains(a) {
			t.Fatalf("Classify(%s) allowed an address outside 2000::/3", a)
		}
	})
}

// FuzzSplitTarget checks the parser of untrusted proxy targets: it never
// panics, and what it accepts is canonical, re-parses to itself and holds
// no byte a resolver or a log line could misread.
func FuzzSplitTarget(f *testing.F) {
	for _, s := range []string{
		"example.com:443", "[2001:db8::1]:80", "10.0.0.1:22", "localhost:8080", "[::1]",
		"a..b:1", "[fe80::1%25eth0]:80", "example.com:0", "example.com:65536", "exa mple:80",
		"[::ffff:127.0.0.1]:443", "xn--bcher-kva.example:443", "host:+80", "1.2.3.4:080",
	} {
		f.Add(s, uint16(0))
		f.Add(s, uint16(80))
	}
	f.Fuzz(func(t *testing.T, s string, def uint16) {
		host, port, err := splitTarget(s, def)
		if err != nil {
			return
		}
		if host == "" || port == 0 {
			t.Fatalf("splitTarget(%q) = %q, %d: empty host or zero port", s, host, port)
		}
		for i := 0; i < len(host); i++ {
			c := host[i]
			if c <= ' ' || c >= 0x7f || c == '%' || c == '/' || c == '[' || c == ']' {
				t.Fatalf("splitTarget(%q) host %q holds byte %#x", s, host, c)
			}
		}
		if strings.ToLower(host) != host {
			t.Fatalf("splitTarget(%q) host %q is not lower case", s, host)
		}
		joined := joinTarget(host, port)
		h2, p2, err := splitTarget(joined, 0)
		if err != nil || h2 != host || p2 != port {
			t.Fatalf("splitTarget(%q) = %q,%d; re-parse of %q = %q,%d,%v", s, host, port, joined, h2, p2, err)
		}
	})
}
