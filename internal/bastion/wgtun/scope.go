package wgtun

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"
)

// Reasons a tunnel refuses a configuration, a peer, a connection or a dial.
// They are stable: callers and tests match them, and they appear in logs.
const (
	// ReasonWideAllowedIP: a peer's allowed address is wider than one
	// address (/32 for IPv4, /128 for IPv6), so the peer could reach or
	// speak for more than its own tunnel address.
	ReasonWideAllowedIP = "tunnel-wide-allowed-ip"
	// ReasonPeerIsSelf: a peer's allowed address is this end's own
	// address, or its public key is this end's own public key.
	ReasonPeerIsSelf = "tunnel-peer-is-self"
	// ReasonBadAllowedIP: a peer's allowed address is missing, unspecified
	// (0.0.0.0, ::), multicast, or an IPv4-mapped IPv6 address.
	ReasonBadAllowedIP = "tunnel-bad-allowed-ip"
	// ReasonBadPeerKey: a peer's public key is all zeros (unset).
	ReasonBadPeerKey = "tunnel-bad-peer-key"
	// ReasonBadEndpoint: a peer's endpoint is set but has no port or an
	// unspecified or multicast address.
	ReasonBadEndpoint = "tunnel-bad-endpoint"
	// ReasonBadKeepalive: a peer's keepalive is negative, not whole
	// seconds, or over 65535 s.
	ReasonBadKeepalive = "tunnel-bad-keepalive"
	// ReasonDuplicatePeer: the same public key appears twice in a Config.
	ReasonDuplicatePeer = "tunnel-duplicate-peer"
	// ReasonAddressTaken: a peer's allowed address is already another
	// peer's. WireGuard would silently move the address to the newer peer;
	// we refuse instead, so one bastion's pairing cannot take another's.
	ReasonAddressTaken = "tunnel-address-taken"
	// ReasonBadConfig: this end's own settings are unusable (no private
	// key, no or a bad tunnel address, a bad listen address, an MTU out of
	// range).
	ReasonBadConfig = "tunnel-bad-config"
	// ReasonForeignSource: a connection reached a tunnel listener from an
	// address that is no current peer's (dropped, never returned by Accept).
	ReasonForeignSource = "tunnel-foreign-source"
	// ReasonDialTarget: DialContext was asked for something other than TCP
	// to a literal address that is a current peer's allowed address.
	ReasonDialTarget = "tunnel-dial-target"
)

// MTU bounds: 1280 is IPv6's minimum, so both families always fit.
const (
	// DefaultMTU is the tunnel MTU when Config.MTU is 0: WireGuard's usual
	// 1420, which fits a 1500-byte path over IPv4 or IPv6.
	DefaultMTU = 1420
	minMTU     = 1280
	maxMTU     = 65535
)

// RefusedError is a refusal with a stable Reason (one of the Reason
// constants) and a human Detail. Match it with errors.As.
type RefusedError struct {
	Reason string
	Detail string
}

// Error is "wgtun: refused (<reason>): <detail>".
func (e *RefusedError) Error() string {
	return "wgtun: refused (" + e.Reason + "): " + e.Detail
}

func refuse(reason, format string, args ...any) error {
	return &RefusedError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Peer is the other end of a tunnel as this end sees it.
type Peer struct {
	PublicKey Key
	// AllowedIP must be a single address (/32 or /128): the peer's own
	// tunnel address, the only source accepted from it and the only
	// destination routed to it. Anything wider is refused.
	AllowedIP netip.Prefix
	// Endpoint zero: learned from the peer's handshake (the control plane
	// side). Set: this end initiates to it (the bastion side).
	Endpoint netip.AddrPort
	// Keepalive is the persistent keepalive interval, whole seconds; 0 is
	// none. The bastion uses 25 s so its NAT mapping stays open.
	Keepalive time.Duration
}

// LogValue keeps a peer's log line to facts that are safe and useful.
func (p Peer) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("public_key", p.PublicKey.String()),
		slog.String("allowed_ip", p.AllowedIP.String()),
		slog.String("endpoint", p.Endpoint.String()),
	)
}

// CheckScoped is the scope rule alone, pure: p's allowed address must be
// exactly one usable address, its key set, its endpoint (if any) usable and
// its keepalive whole seconds that WireGuard can carry. It returns nil or a
// *RefusedError.
func CheckScoped(p Peer) error {
	if p.PublicKey.IsZero() {
		return refuse(ReasonBadPeerKey, "peer public key is unset")
	}
	if !p.AllowedIP.IsValid() {
		return refuse(ReasonBadAllowedIP, "peer allowed address is unset or invalid")
	}
	a := p.AllowedIP.Addr()
	if p.AllowedIP.Bits() != a.BitLen() {
		return refuse(ReasonWideAllowedIP, "peer allowed address %s is wider than one address", p.AllowedIP)
	}
	if a.Is4In6() || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" {
		return refuse(ReasonBadAllowedIP, "peer allowed address %s is not a single unicast address", p.AllowedIP)
	}
	if p.Endpoint.IsValid() {
		ea := p.Endpoint.Addr()
		if p.Endpoint.Port() == 0 || ea.IsUnspecified() || ea.IsMulticast() {
			return refuse(ReasonBadEndpoint, "peer endpoint %s is not a usable address and port", p.Endpoint)
		}
	} else if p.Endpoint != (netip.AddrPort{}) {
		return refuse(ReasonBadEndpoint, "peer endpoint is invalid")
	}
	if p.Keepalive < 0 || p.Keepalive%time.Second != 0 || p.Keepalive > 65535*time.Second {
		return refuse(ReasonBadKeepalive, "peer keepalive %s is not 0 to 65535 whole seconds", p.Keepalive)
	}
	return nil
}

// checkConfig validates this end's own settings and every peer, pure, so Up
// can refuse before it creates any device or socket.
func checkConfig(cfg Config) error {
	if cfg.PrivateKey.IsZero() {
		return refuse(ReasonBadConfig, "private key is unset")
	}
	a := cfg.Address
	if !a.IsValid() || a.Is4In6() || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" {
		return refuse(ReasonBadConfig, "tunnel address %s is not a single unicast address", a)
	}
	if cfg.ListenAddr.IsValid() && (cfg.ListenAddr.Is4In6() || cfg.ListenAddr.IsMulticast() || cfg.ListenAddr.Zone() != "") {
		return refuse(ReasonBadConfig, "listen address %s is not a usable unicast address", cfg.ListenAddr)
	}
	if cfg.MTU != 0 && (cfg.MTU < minMTU || cfg.MTU > maxMTU) {
		return refuse(ReasonBadConfig, "MTU %d is outside %d to %d", cfg.MTU, minMTU, maxMTU)
	}
	self := cfg.PrivateKey.Public()
	keys := make(map[Key]bool, len(cfg.Peers))
	addrs := make(map[netip.Addr]bool, len(cfg.Peers))
	for _, p := range cfg.Peers {
		if err := checkPeer(p, self, a); err != nil {
			return err
		}
		if keys[p.PublicKey] {
			return refuse(ReasonDuplicatePeer, "peer %s appears twice", p.PublicKey)
		}
		if addrs[p.AllowedIP.Addr()] {
			return refuse(ReasonAddressTaken, "allowed address %s is given to two peers", p.AllowedIP)
		}
		keys[p.PublicKey] = true
		addrs[p.AllowedIP.Addr()] = true
	}
	return nil
}

// checkPeer is CheckScoped plus the rules that need this end's identity: a
// peer is never this end itself.
func checkPeer(p Peer, selfPub Key, selfAddr netip.Addr) error {
	if err := CheckScoped(p); err != nil {
		return err
	}
	if p.PublicKey == selfPub {
		return refuse(ReasonPeerIsSelf, "peer public key is this tunnel's own")
	}
	if p.AllowedIP.Addr() == selfAddr {
		return refuse(ReasonPeerIsSelf, "peer allowed address %s is this tunnel's own address", p.AllowedIP)
	}
	return nil
}
