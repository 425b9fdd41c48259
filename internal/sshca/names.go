package sshca

import (
	"net/netip"
	"strings"
)

// MaxAccountLen is the longest Unix account name accepted (useradd's
// default limit).
const MaxAccountLen = 32

// ValidAccount reports whether s is a Unix account name:
// ^[a-z_][a-z0-9_-]{0,31}$. Such a name cannot start with '-' (so ssh
// never reads it as an option), has no '%' (so it never expands in
// ssh's %r or sshd's %u tokens), no '@', ',' or space (so the principal
// "<account>@<node>" is one token), and no '/' or '.' (so the principals
// file named after it stays in its directory).
func ValidAccount(s string) bool {
	if s == "" || len(s) > MaxAccountLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case (c >= '0' && c <= '9' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// MaxHostLen is the longest DNS host name accepted.
const MaxHostLen = 253

// ValidHost reports whether s is only a host name or an IP address, fit to
// hand to ssh or a dialer as the host: an IPv4 address in dotted decimal,
// an IPv6 address without brackets or zone, or a DNS host name (labels of
// 1 to 63 letters, digits and '-', not starting or ending with '-', at most
// 253 characters, no trailing dot). The last label of a host name must not
// be numeric (all digits, or 0x and hex digits), because the resolver's
// inet_aton would read "127.1" or "0x7f.1" as an IP address in another
// spelling. Anything else (a leading '-', space, '@', '%', ':' outside an
// IPv6 literal, quotes, brackets, '/', control bytes) is refused.
func ValidHost(s string) bool {
	if s == "" || len(s) > MaxHostLen {
		return false
	}
	if strings.ContainsRune(s, ':') {
		a, err := netip.ParseAddr(s)
		return err == nil && a.Is6() && a.Zone() == ""
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Is4()
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if !validLabel(l) {
			return false
		}
	}
	return !numericLabel(labels[len(labels)-1])
}

// validLabel reports whether l is a DNS label of letters, digits and '-'.
func validLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// numericLabel reports whether inet_aton could read l as a number:
// decimal or octal digits, or 0x followed by hex digits (or nothing).
func numericLabel(l string) bool {
	digits := l
	hex := false
	if len(l) >= 2 && l[0] == '0' && (l[1] == 'x' || l[1] == 'X') {
		digits, hex = l[2:], true
	}
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		isHex := c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
		if !(c >= '0' && c <= '9' || hex && isHex) {
			return false
		}
	}
	return true
}
