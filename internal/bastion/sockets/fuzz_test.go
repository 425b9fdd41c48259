package sockets

import "testing"

// FuzzParseLine feeds parseLine arbitrary lines: it must never panic, and a
// line it accepts must round-trip through formatLine to the same socket.
func FuzzParseLine(f *testing.F) {
	f.Add(uint8(0), "   0: 0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 12345 1 0000000000000000 100 0 0 10 0")
	f.Add(uint8(3), "   3: 0000000000000000FFFF00000100007F:0035 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 99 2 0000000000000000 0")
	f.Fuzz(func(t *testing.T, which uint8, line string) {
		proto := protos()[int(which)%len(protos())]
		s, state, err := parseLine(proto, line)
		if err != nil {
			return
		}
		if s.Proto != proto {
			t.Fatalf("proto %q, want %q", s.Proto, proto)
		}
		if proto == "tcp" || proto == "udp" {
			if !s.Local.Addr().Is4() {
				t.Fatalf("IPv4 table gave %v", s.Local)
			}
		} else if !s.Local.Addr().Is6() {
			t.Fatalf("IPv6 table gave %v", s.Local)
		}
		again, state2, err := parseLine(proto, formatLine(s, state))
		if err != nil || again != s || state2 != state {
			t.Fatalf("round trip of %v (%#x) gave %v (%#x), %v", s, state, again, state2, err)
		}
	})
}
