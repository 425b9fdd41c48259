package netguard

import (
	"fmt"
	"net/netip"
	"strings"
)

// AllowList names the hosts an operator chose to reach even though the
// rules would refuse them (`--allow-lan` on the command line, Config.Allow
// in code). An entry is a host name (matched exactly, case-insensitive,
// trailing dot ignored; no wildcards), an IP address, or a CIDR prefix.
// A listed name skips every refusal for every address it resolves to, the
// localhost-name refusal included; a listed address or prefix skips every
// refusal for exactly the addresses it covers. An AllowList is immutable
// after ParseAllowList returns it.
type AllowList struct {
	names    map[string]bool
	prefixes []netip.Prefix
}

// ParseAllowList parses allow-list entries. It rejects anything that is not
// a valid host name, address or prefix, so a typo cannot silently widen or
// narrow the list.
func ParseAllowList(entries []string) (*AllowList, error) {
	l := &AllowList{names: make(map[string]bool)}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if strings.Contains(e, "/") {
			p, err := netip.ParsePrefix(strings.Trim(e, "[]"))
			if err != nil {
				return nil, fmt.Errorf("netguard: allow entry %q: %w", e, err)
			}
			if p.Addr().Zone() != "" {
				return nil, fmt.Errorf("netguard: allow entry %q: zones are not accepted", e)
			}
			if p.Addr().Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			l.prefixes = append(l.prefixes, p.Masked())
			continue
		}
		addr, name, err := parseHost(e)
		if err != nil {
			return nil, fmt.Errorf("netguard: allow entry %q: %w", e, err)
		}
		if addr.IsValid() {
			addr = addr.Unmap()
			l.prefixes = append(l.prefixes, netip.PrefixFrom(addr, addr.BitLen()))
			continue
		}
		l.names[normName(name)] = true
	}
	return l, nil
}

// AllowsName reports whether the host name was listed.
func (l *AllowList) AllowsName(name string) bool {
	if l == nil || name == "" {
		return false
	}
	return l.names[normName(name)]
}

// AllowsAddr reports whether the address is covered by a listed address or
// prefix. An IPv4-mapped address matches as its IPv4 address.
func (l *AllowList) AllowsAddr(a netip.Addr) bool {
	if l == nil || !a.IsValid() {
		return false
	}
	a = a.Unmap().WithZone("")
	for _, p := range l.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
