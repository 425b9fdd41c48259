package netguard

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// maxTargetLen bounds a "host:port" target: a 253-byte name, a trailing
// dot, a colon and five digits fit with room to spare.
const maxTargetLen = 300

// ErrBadTarget is wrapped by every error about a malformed host or target,
// so callers (the proxy's 400, the check command's exit code 2) can tell bad
// input from a refusal or a network failure.
var ErrBadTarget = errors.New("bad target")

func badTarget(format string, args ...any) error {
	return fmt.Errorf("netguard: %w: %s", ErrBadTarget, fmt.Sprintf(format, args...))
}

// validHostName reports whether h is a DNS host name we are willing to hand
// to a resolver: ASCII letters, digits, '-' and '_' in dot-separated labels
// of 1 to 63 bytes, 253 bytes at most, one trailing dot allowed. It rejects
// anything a resolver or a log line could misread (spaces, '%', '/', NUL,
// non-ASCII; IDNs must arrive in their xn-- form).
func validHostName(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			switch {
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			default:
				return false
			}
		}
	}
	return true
}

// normName is the form names are compared in: lower case, no trailing dot.
func normName(h string) string {
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// isLocalhostName reports whether h is "localhost" or a name under
// ".localhost" (RFC 6761), in any case, with or without a trailing dot.
// Such names are refused before any lookup.
func isLocalhostName(h string) bool {
	n := normName(h)
	return n == "localhost" || strings.HasSuffix(n, ".localhost")
}

// parseHost parses a bare host: an IP address (IPv6 optionally in
// brackets; zones are refused because a zone picks an interface) or a host
// name. Exactly one of addr and name is set on success; name is returned
// lower-cased.
func parseHost(h string) (addr netip.Addr, name string, err error) {
	if len(h) == 0 || len(h) > maxTargetLen {
		return netip.Addr{}, "", badTarget("empty or overlong host")
	}
	bracketed := false
	if h[0] == '[' {
		if h[len(h)-1] != ']' || len(h) < 3 {
			return netip.Addr{}, "", badTarget("unterminated IPv6 literal")
		}
		h = h[1 : len(h)-1]
		bracketed = true
	}
	if strings.IndexByte(h, '%') >= 0 {
		return netip.Addr{}, "", badTarget("zoned addresses are not accepted")
	}
	if a, perr := netip.ParseAddr(h); perr == nil {
		if bracketed && !a.Is6() {
			return netip.Addr{}, "", badTarget("IPv4 address in brackets")
		}
		return a, "", nil
	}
	if bracketed || strings.IndexByte(h, ':') >= 0 {
		return netip.Addr{}, "", badTarget("invalid IP address")
	}
	if !validHostName(h) {
		return netip.Addr{}, "", badTarget("invalid host name")
	}
	return netip.Addr{}, strings.ToLower(h), nil
}

// splitTarget parses an authority-form target "host:port" as it arrives in
// an HTTP CONNECT request, an absolute-form URI's authority or a dial
// address. IPv6 literals must be bracketed. When the port is absent,
// defaultPort is used, or, when defaultPort is 0, the target is refused.
// The returned host is the canonical address text or the lower-cased name.
func splitTarget(s string, defaultPort uint16) (host string, port uint16, err error) {
	if len(s) == 0 || len(s) > maxTargetLen {
		return "", 0, badTarget("empty or overlong target")
	}
	hostPart, portPart := s, ""
	hasPort := false
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", 0, badTarget("unterminated IPv6 literal")
		}
		hostPart = s[:end+1]
		switch rest := s[end+1:]; {
		case rest == "":
		case rest[0] == ':':
			portPart, hasPort = rest[1:], true
		default:
			return "", 0, badTarget("junk after IPv6 literal")
		}
	} else if i := strings.IndexByte(s, ':'); i >= 0 {
		if strings.IndexByte(s[i+1:], ':') >= 0 {
			return "", 0, badTarget("IPv6 literal must be in brackets")
		}
		hostPart, portPart, hasPort = s[:i], s[i+1:], true
	}
	addr, name, err := parseHost(hostPart)
	if err != nil {
		return "", 0, err
	}
	if hasPort {
		port, err = parsePort(portPart)
		if err != nil {
			return "", 0, err
		}
	} else {
		if defaultPort == 0 {
			return "", 0, badTarget("missing port")
		}
		port = defaultPort
	}
	if addr.IsValid() {
		return addr.String(), port, nil
	}
	return name, port, nil
}

// parsePort accepts 1 to 5 decimal digits naming a port from 1 to 65535.
func parsePort(p string) (uint16, error) {
	if len(p) == 0 || len(p) > 5 {
		return 0, badTarget("invalid port")
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return 0, badTarget("invalid port")
		}
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return 0, badTarget("invalid port")
	}
	return uint16(n), nil
}

// joinTarget is the inverse of splitTarget for its canonical output.
func joinTarget(host string, port uint16) string {
	if strings.IndexByte(host, ':') >= 0 {
		return "[" + host + "]:" + strconv.Itoa(int(port))
	}
	return host + ":" + strconv.Itoa(int(port))
}
