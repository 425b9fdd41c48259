package netguard

import (
	"net/netip"
)

// Reason is a stable lowercase code naming why an address or name is
// refused. The empty Reason means "allowed". The codes are part of the
// user-visible contract (proxy 403 bodies, logs, metrics labels, the
// `bcd egress check` output) and must not change meaning.
type Reason string

// Reason codes. For an address that embeds an IPv4 address (IPv4-mapped,
// IPv4-compatible, IPv4-translated, NAT64 64:ff9b::/96, 6to4 2002::/16 and
// Teredo 2001::/32) the reason is the embedded IPv4 address's own reason,
// unprefixed: ::ffff:10.0.0.1 is refused as "private", 2002:7f00:1:: as
// "loopback". The deprecated forms with a public embedded address are refused
// with their own code ("ipv4-compatible", "ipv4-translated").
const (
	// Allowed is the empty reason: the address is public internet.
	Allowed Reason = ""
	// ReasonLoopback: 127.0.0.0/8 and ::1.
	ReasonLoopback Reason = "loopback"
	// ReasonUnspecified: 0.0.0.0/8 ("this network") and ::.
	ReasonUnspecified Reason = "unspecified"
	// ReasonLinkLocal: 169.254.0.0/16 (cloud metadata 169.254.169.254
	// included) and fe80::/10.
	ReasonLinkLocal Reason = "link-local"
	// ReasonPrivate: RFC 1918 10/8, 172.16/12, 192.168/16.
	ReasonPrivate Reason = "private"
	// ReasonCGNAT: RFC 6598 shared address space 100.64.0.0/10 (Alibaba
	// Cloud's metadata 100.100.100.200 included).
	ReasonCGNAT Reason = "cgnat"
	// ReasonULA: unique local fc00::/7 (AWS's fd00:ec2::254 included).
	ReasonULA Reason = "ula"
	// ReasonBenchmarking: 198.18.0.0/15 and 2001:2::/48.
	ReasonBenchmarking Reason = "benchmarking"
	// ReasonReserved: 240.0.0.0/4 and IPv6 outside 2000::/3 that no other
	// rule names (IANA "Reserved by IETF" space).
	ReasonReserved Reason = "reserved"
	// ReasonMulticast: 224.0.0.0/4 and ff00::/8.
	ReasonMulticast Reason = "multicast"
	// ReasonBroadcast: 255.255.255.255.
	ReasonBroadcast Reason = "broadcast"
	// ReasonIPv4Compatible: deprecated IPv4-compatible ::a.b.c.d (::/96).
	ReasonIPv4Compatible Reason = "ipv4-compatible"
	// ReasonIPv4Translated: deprecated IPv4-translated ::ffff:0:a.b.c.d
	// (::ffff:0:0:0/96, RFC 2765).
	ReasonIPv4Translated Reason = "ipv4-translated"
	// ReasonSiteLocal: deprecated site-local fec0::/10.
	ReasonSiteLocal Reason = "site-local"
	// ReasonNAT64Local: 64:ff9b::/32 outside the well-known 64:ff9b::/96
	// prefix, including the local-use 64:ff9b:1::/48.
	ReasonNAT64Local Reason = "nat64-local"
	// ReasonDocumentation: TEST-NET-1/2/3, 2001:db8::/32 and 3fff::/20.
	ReasonDocumentation Reason = "documentation"
	// ReasonSpecialPurpose: any other IANA special-purpose entry that is not
	// a globally reachable unicast locator (see the table in classify.go).
	ReasonSpecialPurpose Reason = "special-purpose"
	// ReasonCloudMetadata: a cloud host endpoint on an otherwise public
	// address (Azure's 168.63.129.16 wire server).
	ReasonCloudMetadata Reason = "cloud-metadata"
	// ReasonThisMachine: an address this machine takes as its own.
	ReasonThisMachine Reason = "this-machine"
	// ReasonLocalhostName: the name localhost or a name under .localhost,
	// refused before any lookup.
	ReasonLocalhostName Reason = "localhost-name"
	// ReasonUnknown: the guard cannot tell (invalid address, the kernel
	// could not be asked); refused.
	ReasonUnknown Reason = "unknown"
)

// Refused reports whether r is a refusal (any non-empty reason).
func (r Reason) Refused() bool { return r != Allowed }

// String returns the reason code, or "allowed" for the empty reason.
func (r Reason) String() string {
	if r == Allowed {
		return "allowed"
	}
	return string(r)
}

// rule is one row of the classification tables: every address inside
// Prefix gets Reason. Rows are matched in order; the first match wins.
type rule struct {
	Prefix netip.Prefix
	Reason Reason
	Source string // where the range comes from, for readers and docs
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// v4Rules is the IPv4 table. It covers every entry of the IANA IPv4
// Special-Purpose Address Registry plus multicast (IPv4 Address Space
// registry). Entries that IANA marks globally reachable and that are real
// unicast services are allowed and listed only in this comment.
//
//	Prefix               Name (IANA)                         RFC           Global  Verdict
//	0.0.0.0/8            "This network"                      RFC 791       no      unspecified
//	0.0.0.0/32           "This host on this network"         RFC 1122      no      unspecified
//	10.0.0.0/8           Private-Use                         RFC 1918      no      private
//	100.64.0.0/10        Shared Address Space                RFC 6598      no      cgnat
//	127.0.0.0/8          Loopback                            RFC 1122      no      loopback
//	169.254.0.0/16       Link Local                          RFC 3927      no      link-local
//	172.16.0.0/12        Private-Use                         RFC 1918      no      private
//	192.0.0.0/24         IETF Protocol Assignments           RFC 6890      no      special-purpose
//	192.0.0.0/29         IPv4 Service Continuity Prefix      RFC 7335      no      special-purpose
//	192.0.0.8/32         IPv4 dummy address                  RFC 7600      no      special-purpose
//	192.0.0.9/32         Port Control Protocol Anycast       RFC 7723      yes     special-purpose (strict: anycast to the local gateway)
//	192.0.0.10/32        Traversal Using Relays (TURN) Any.  RFC 8155      yes     special-purpose (strict)
//	192.0.0.170/32,.171  NAT64/DNS64 Discovery               RFC 8880      no      special-purpose
//	192.0.2.0/24         Documentation (TEST-NET-1)          RFC 5737      no      documentation
//	192.31.196.0/24      AS112-v4                            RFC 7535      yes     allowed
//	192.52.193.0/24      AMT                                 RFC 7450      yes     allowed
//	192.88.99.0/24       Deprecated (6to4 Relay Anycast)     RFC 7526      no      special-purpose
//	192.88.99.2/32       6a44-relay anycast address          RFC 6751      no      special-purpose
//	192.168.0.0/16       Private-Use                         RFC 1918      no      private
//	192.175.48.0/24      Direct Delegation AS112 Service     RFC 7534      yes     allowed
//	198.18.0.0/15        Benchmarking                        RFC 2544      no      benchmarking
//	198.51.100.0/24      Documentation (TEST-NET-2)          RFC 5737      no      documentation
//	203.0.113.0/24       Documentation (TEST-NET-3)          RFC 5737      no      documentation
//	224.0.0.0/4          Multicast (Address Space registry)  RFC 5771      -       multicast
//	240.0.0.0/4          Reserved                            RFC 1112      no      reserved
//	255.255.255.255/32   Limited Broadcast                   RFC 919/8190  no      broadcast
//	168.63.129.16/32     (not IANA) Azure host wire server   -             -       cloud-metadata
var v4Rules = []rule{
	{mustPrefix("0.0.0.0/8"), ReasonUnspecified, "RFC 791 this network; RFC 1122 this host"},
	{mustPrefix("10.0.0.0/8"), ReasonPrivate, "RFC 1918"},
	{mustPrefix("100.64.0.0/10"), ReasonCGNAT, "RFC 6598"},
	{mustPrefix("127.0.0.0/8"), ReasonLoopback, "RFC 1122"},
	{mustPrefix("169.254.0.0/16"), ReasonLinkLocal, "RFC 3927"},
	{mustPrefix("172.16.0.0/12"), ReasonPrivate, "RFC 1918"},
	{mustPrefix("192.0.0.0/24"), ReasonSpecialPurpose, "RFC 6890 IETF protocol assignments (incl. RFC 7335, 7600, 7723, 8155, 8880)"},
	{mustPrefix("192.0.2.0/24"), ReasonDocumentation, "RFC 5737 TEST-NET-1"},
	{mustPrefix("192.88.99.0/24"), ReasonSpecialPurpose, "RFC 7526 deprecated 6to4 relay anycast; RFC 6751"},
	{mustPrefix("192.168.0.0/16"), ReasonPrivate, "RFC 1918"},
	{mustPrefix("198.18.0.0/15"), ReasonBenchmarking, "RFC 2544"},
	{mustPrefix("198.51.100.0/24"), ReasonDocumentation, "RFC 5737 TEST-NET-2"},
	{mustPrefix("203.0.113.0/24"), ReasonDocumentation, "RFC 5737 TEST-NET-3"},
	{mustPrefix("224.0.0.0/4"), ReasonMulticast, "RFC 5771"},
	{mustPrefix("255.255.255.255/32"), ReasonBroadcast, "RFC 919, RFC 8190"},
	{mustPrefix("240.0.0.0/4"), ReasonReserved, "RFC 1112 section 4"},
	{mustPrefix("168.63.129.16/32"), ReasonCloudMetadata, "Azure wire server (not IANA)"},
}

// v6Rules is the IPv6 table for the ranges that are refused outright. The
// embedded-IPv4 forms, NAT64, 6to4, Teredo and the "outside 2000::/3" rule
// are handled in code (classify6) because they depend on the embedded
// address. Every entry of the IANA IPv6 Special-Purpose Address Registry is
// covered as follows:
//
//	Prefix               Name (IANA)                         RFC           Global  Verdict
//	::1/128              Loopback Address                    RFC 4291      no      loopback
//	::/128               Unspecified Address                 RFC 4291      no      unspecified
//	::ffff:0:0/96        IPv4-mapped Address                 RFC 4291      no      embedded IPv4 judged
//	::/96 (rest)         IPv4-compatible (deprecated)        RFC 4291      -       embedded reason, else ipv4-compatible
//	::ffff:0:0:0/96      IPv4-translated (deprecated)        RFC 2765      -       embedded reason, else ipv4-translated
//	64:ff9b::/96         IPv4-IPv6 Translat.                 RFC 6052      yes     embedded IPv4 judged
//	64:ff9b:1::/48       Local-use IPv4/IPv6 Translation     RFC 8215      no      nat64-local
//	64:ff9b::/32 (rest)  (unassigned remainder)              RFC 8215      -       nat64-local
//	100::/64             Discard-Only Address Block          RFC 6666      no      special-purpose
//	100:0:0:1::/64       Dummy IPv6 Prefix                   RFC 9780      no      special-purpose
//	2001::/23            IETF Protocol Assignments           RFC 2928      no      special-purpose
//	2001::/32            TEREDO                              RFC 4380/8190 -       server and client IPv4 judged
//	2001:1::1/128        Port Control Protocol Anycast       RFC 7723      yes     special-purpose (strict)
//	2001:1::2/128        TURN Anycast                        RFC 8155      yes     special-purpose (strict)
//	2001:1::3/128        DNS-SD Service Registration Proto.  RFC 9665      yes     special-purpose (strict)
//	2001:2::/48          Benchmarking                        RFC 5180      no      benchmarking
//	2001:3::/32          AMT                                 RFC 7450      yes     allowed
//	2001:4:112::/48      AS112-v6                            RFC 7535      yes     allowed
//	2001:10::/28         Deprecated (previously ORCHID)      RFC 4843      no      special-purpose
//	2001:20::/28         ORCHIDv2                            RFC 7343      yes     special-purpose (identifiers, not locators)
//	2001:30::/28         Drone Remote ID Entity Tags (DETs)  RFC 9374      yes     special-purpose (identifiers, not locators)
//	2001:db8::/32        Documentation                       RFC 3849      no      documentation
//	2002::/16            6to4                                RFC 3056      -       embedded IPv4 judged
//	2620:4f:8000::/48    Direct Delegation AS112 Service     RFC 7534      yes     allowed
//	3fff::/20            Documentation                       RFC 9637      no      documentation
//	5f00::/16            Segment Routing (SRv6) SIDs         RFC 9602      no      special-purpose
//	fc00::/7             Unique-Local                        RFC 4193/8190 no      ula
//	fe80::/10            Link-Local Unicast                  RFC 4291      no      link-local
//	fec0::/10            Site-local (deprecated)             RFC 3879      -       site-local
//	ff00::/8             Multicast                           RFC 4291      -       multicast
//	outside 2000::/3     Reserved by IETF (Address Space)    RFC 4291      -       reserved
var v6Rules = []rule{
	{mustPrefix("64:ff9b::/32"), ReasonNAT64Local, "RFC 8215 (64:ff9b::/96 is handled before this row)"},
	{mustPrefix("100::/64"), ReasonSpecialPurpose, "RFC 6666 discard-only"},
	{mustPrefix("100:0:0:1::/64"), ReasonSpecialPurpose, "RFC 9780 dummy prefix"},
	{mustPrefix("2001:2::/48"), ReasonBenchmarking, "RFC 5180"},
	{mustPrefix("2001:3::/32"), Allowed, "RFC 7450 AMT (globally reachable)"},
	{mustPrefix("2001:4:112::/48"), Allowed, "RFC 7535 AS112-v6 (globally reachable)"},
	{mustPrefix("2001::/23"), ReasonSpecialPurpose, "RFC 2928 IETF protocol assignments (incl. RFC 7723, 8155, 9665, 4843, 7343, 9374)"},
	{mustPrefix("2001:db8::/32"), ReasonDocumentation, "RFC 3849"},
	{mustPrefix("3fff::/20"), ReasonDocumentation, "RFC 9637"},
	{mustPrefix("5f00::/16"), ReasonSpecialPurpose, "RFC 9602 SRv6 SIDs"},
	{mustPrefix("fc00::/7"), ReasonULA, "RFC 4193"},
	{mustPrefix("fe80::/10"), ReasonLinkLocal, "RFC 4291"},
	{mustPrefix("fec0::/10"), ReasonSiteLocal, "RFC 3879"},
	{mustPrefix("ff00::/8"), ReasonMulticast, "RFC 4291"},
}

// Well-known prefixes whose embedded IPv4 address is judged.
var (
	prefixNAT64   = mustPrefix("64:ff9b::/96")
	prefix6to4    = mustPrefix("2002::/16")
	prefixTeredo  = mustPrefix("2001::/32")
	prefixGlobal6 = mustPrefix("2000::/3")
	prefixCompat  = mustPrefix("::/96")
	prefixTransl  = mustPrefix("::ffff:0:0:0/96")
	prefixMapped  = mustPrefix("::ffff:0:0/96")
	addrUnspec6   = netip.IPv6Unspecified()
	addrLoopback6 = netip.IPv6Loopback()
)

// Classify judges one address without any system access and returns the
// reason it is refused, or Allowed. It does not rely on net.IP's
// IsGlobalUnicast/IsPrivate, which call 100.64/10, 198.18/15, 240/4 and
// several IPv6 forms global. A zone is ignored: fe80::1%eth0 is judged as
// fe80::1. The invalid zero Addr is refused as ReasonUnknown.
//
// Classify does not know which addresses are this machine's; the Dialer adds
// that through a LocalChecker.
func Classify(a netip.Addr) Reason {
	if !a.IsValid() {
		return ReasonUnknown
	}
	a = a.WithZone("")
	if a.Is4() {
		return classify4(a)
	}
	return classify6(a)
}

func classify4(a netip.Addr) Reason {
	for _, r := range v4Rules {
		if r.Prefix.Contains(a) {
			return r.Reason
		}
	}
	return Allowed
}

// embedded4 returns the IPv4 address held in bytes [from, from+4) of a,
// XORed with mask (Teredo obfuscates the client address).
func embedded4(b [16]byte, from int, mask byte) netip.Addr {
	return netip.AddrFrom4([4]byte{b[from] ^ mask, b[from+1] ^ mask, b[from+2] ^ mask, b[from+3] ^ mask})
}

// Embedded4 returns the IPv4 addresses an IPv6 address carries in a
// well-known form (mapped, compatible, translated, NAT64 64:ff9b::/96, 6to4,
// and Teredo's server and client), which a translator or relay would reach.
// The this-machine check judges each of them as well as the address itself:
// with 8.8.8.8 this machine's own, 64:ff9b::808:808 is this machine too.
func Embedded4(a netip.Addr) []netip.Addr {
	if !a.Is6() {
		return nil
	}
	b := a.As16()
	switch {
	case a == addrUnspec6 || a == addrLoopback6:
		return nil
	case prefixMapped.Contains(a):
		return []netip.Addr{a.Unmap()}
	case prefixCompat.Contains(a), prefixTransl.Contains(a), prefixNAT64.Contains(a):
		return []netip.Addr{embedded4(b, 12, 0)}
	case prefix6to4.Contains(a):
		return []netip.Addr{embedded4(b, 2, 0)}
	case prefixTeredo.Contains(a):
		return []netip.Addr{embedded4(b, 4, 0), embedded4(b, 12, 0xff)}
	}
	return nil
}

func classify6(a netip.Addr) Reason {
	b := a.As16()
	switch {
	case a == addrUnspec6:
		return ReasonUnspecified
	case a == addrLoopback6:
		return ReasonLoopback
	case prefixMapped.Contains(a):
		// ::ffff:a.b.c.d is the IPv4 address itself.
		return classify4(a.Unmap())
	case prefixCompat.Contains(a):
		if r := classify4(embedded4(b, 12, 0)); r.Refused() {
			return r
		}
		return ReasonIPv4Compatible
	case prefixTransl.Contains(a):
		if r := classify4(embedded4(b, 12, 0)); r.Refused() {
			return r
		}
		return ReasonIPv4Translated
	case prefixNAT64.Contains(a):
		return classify4(embedded4(b, 12, 0))
	case prefix6to4.Contains(a):
		return classify4(embedded4(b, 2, 0))
	case prefixTeredo.Contains(a):
		// 2001:0:SSSS:SSSS:flags:port:CCCC:CCCC, client obfuscated by XOR.
		if r := classify4(embedded4(b, 12, 0xff)); r.Refused() {
			return r
		}
		return classify4(embedded4(b, 4, 0))
	}
	for _, r := range v6Rules {
		if r.Prefix.Contains(a) {
			return r.Reason
		}
	}
	if !prefixGlobal6.Contains(a) {
		return ReasonReserved
	}
	return Allowed
}
