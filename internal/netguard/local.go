package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// LocalChecker tells whether an address is this machine's own, so that a
// public address on one of its interfaces, an AnyIP range on lo or a
// container on a bridge made here is refused like loopback is.
//
// IsLocal returns local=true with a short human description in why (for
// logs, never for clients). An error means the machine cannot tell; callers
// must then refuse (the Dialer refuses with ReasonUnknown).
type LocalChecker interface {
	IsLocal(ctx context.Context, a netip.Addr) (local bool, why string, err error)
}

// Route types as the Linux kernel names them (RTN_* in rtnetlink.h). They
// are defined here so the decision logic builds and is tested on every OS.
const (
	rtnUnicast   = 1
	rtnLocal     = 2
	rtnBroadcast = 3
	rtnAnycast   = 4
	rtnMulticast = 5
)

// linkKind is a network interface's kind, reduced to what decides whether
// a link stays on this machine.
type linkKind string

const (
	kindLoopback linkKind = "loopback"
	kindVeth     linkKind = "veth"
	kindBridge   linkKind = "bridge"
	kindTap      linkKind = "tap"
	kindTun      linkKind = "tun"
	kindDummy    linkKind = "dummy"
	// Anything else (a NIC, bond, VLAN, VXLAN, WireGuard, ...) leaves.
	kindOther linkKind = "other"
)

// kernelRoute is the answer to a route lookup for one destination.
type kernelRoute struct {
	Type       int  // rtn* constant
	LinkIndex  int  // output interface
	HasGateway bool // the route sends the packet on through a gateway
}

// kernelLink describes one interface.
type kernelLink struct {
	Index  int
	Name   string
	Kind   linkKind
	Detail string // the kernel's own kind name, for logs
}

// errNoRoute is returned by kernel.RouteGet when the kernel has no route
// at all to the address (ENETUNREACH/EHOSTUNREACH): it will not deliver a
// packet anywhere, this machine included, so the address is not local.
var errNoRoute = errors.New("no route to destination")

// kernel is the small slice of the OS the route-based checker needs. The
// Linux implementation speaks rtnetlink; tests use a fake.
type kernel interface {
	InterfaceAddrs() ([]netip.Addr, error)
	RouteGet(a netip.Addr) (kernelRoute, error)
	Link(index int) (kernelLink, error)
	BridgePorts(bridgeIndex int) ([]kernelLink, error)
	DefaultRouteLinks() (map[int]bool, error)
}

// routeChecker decides "this machine" from interface addresses and a
// route lookup made per call (so a route added a moment ago counts).
type routeChecker struct {
	k kernel
}

// IsLocal implements LocalChecker. The order is: interface addresses; the
// route lookup (local, broadcast, anycast and multicast routes are this
// machine; a route through a gateway leaves); and for a route straight onto
// a link, whether that link stays on this machine: never the link a main
// table default route leaves by; otherwise loopback, a veth, a tap, a dummy,
// or a bridge whose every port is a veth, tap or dummy.
func (c routeChecker) IsLocal(ctx context.Context, a netip.Addr) (bool, string, error) {
	if err := ctx.Err(); err != nil {
		return false, "", fmt.Errorf("netguard: local check: %w", err)
	}
	if !a.IsValid() {
		return false, "", errors.New("netguard: local check: invalid address")
	}
	a = a.Unmap().WithZone("")
	addrs, err := c.k.InterfaceAddrs()
	if err != nil {
		return false, "", fmt.Errorf("netguard: list interface addresses: %w", err)
	}
	for _, ia := range addrs {
		if ia.Unmap().WithZone("") == a {
			return true, "interface address", nil
		}
	}
	rt, err := c.k.RouteGet(a)
	if errors.Is(err, errNoRoute) {
		return false, "", nil
	}
	if err != nil {
		return false, "", fmt.Errorf("netguard: route lookup for %s: %w", a, err)
	}
	switch rt.Type {
	case rtnLocal:
		return true, "local route", nil
	case rtnBroadcast:
		return true, "broadcast route", nil
	case rtnAnycast:
		return true, "anycast route", nil
	case rtnMulticast:
		return true, "multicast route", nil
	case rtnUnicast:
	default:
		return false, "", fmt.Errorf("netguard: route lookup for %s: unexpected route type %d", a, rt.Type)
	}
	if rt.HasGateway {
		return false, "", nil // sent on through a gateway: leaves this machine
	}
	defaults, err := c.k.DefaultRouteLinks()
	if err != nil {
		return false, "", fmt.Errorf("netguard: list default routes: %w", err)
	}
	if defaults[rt.LinkIndex] {
		return false, "", nil // this machine's way out, its LAN included
	}
	l, err := c.k.Link(rt.LinkIndex)
	if err != nil {
		return false, "", fmt.Errorf("netguard: link %d: %w", rt.LinkIndex, err)
	}
	switch l.Kind {
	case kindLoopback, kindVeth, kindTap, kindDummy:
		return true, fmt.Sprintf("route onto %s %s", l.Kind, l.Name), nil
	case kindBridge:
		ports, err := c.k.BridgePorts(l.Index)
		if err != nil {
			return false, "", fmt.Errorf("netguard: ports of bridge %s: %w", l.Name, err)
		}
		for _, p := range ports {
			switch p.Kind {
			case kindVeth, kindTap, kindDummy:
			default:
				return false, "", nil // a NIC, bond, VLAN or tunnel: the LAN
			}
		}
		return true, fmt.Sprintf("route onto bridge %s of local ports", l.Name), nil
	}
	return false, "", nil
}

// addrChecker is the portable fallback: an address is local when it is on
// one of this machine's interfaces. It cannot see local routes or container
// bridges, which only the Linux checker asks the kernel about.
type addrChecker struct {
	addrs func() ([]netip.Addr, error)
}

// IsLocal implements LocalChecker from interface addresses only.
func (c addrChecker) IsLocal(ctx context.Context, a netip.Addr) (bool, string, error) {
	if err := ctx.Err(); err != nil {
		return false, "", fmt.Errorf("netguard: local check: %w", err)
	}
	if !a.IsValid() {
		return false, "", errors.New("netguard: local check: invalid address")
	}
	a = a.Unmap().WithZone("")
	addrs, err := c.addrs()
	if err != nil {
		return false, "", fmt.Errorf("netguard: list interface addresses: %w", err)
	}
	for _, ia := range addrs {
		if ia.Unmap().WithZone("") == a {
			return true, "interface address", nil
		}
	}
	return false, "", nil
}

// goInterfaceAddrs lists interface addresses through the standard library.
func goInterfaceAddrs() ([]netip.Addr, error) {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("interface addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(ifas))
	for _, ifa := range ifas {
		var ip net.IP
		switch v := ifa.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		default:
			continue
		}
		if a, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, a.Unmap())
		}
	}
	return out, nil
}

// NewInterfaceAddrChecker returns a LocalChecker that knows only the
// addresses on this machine's interfaces. NewLocalChecker returns it on
// systems without a route lookup; it is exported for callers that want the
// portable behaviour explicitly.
func NewInterfaceAddrChecker() LocalChecker {
	return addrChecker{addrs: goInterfaceAddrs}
}
