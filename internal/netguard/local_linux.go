//go:build linux

package netguard

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NewLocalChecker returns this OS's LocalChecker. On Linux it asks the
// kernel over rtnetlink on every call: interface addresses, an RTM_GETROUTE
// lookup of the destination, and for a route straight onto a link, the
// link's kind and (for a bridge) its ports. Netlink sockets are opened on
// the calling thread, so the answer is for that thread's network namespace.
func NewLocalChecker() LocalChecker {
	return routeChecker{k: netlinkKernel{}}
}

// netlinkKernel implements kernel with github.com/vishvananda/netlink.
type netlinkKernel struct{}

// dumpRetries bounds retries of a netlink dump the kernel interrupted
// because the table changed underneath it.
const dumpRetries = 3

func retryDump[T any](f func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for range dumpRetries {
		v, err = f()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}

// InterfaceAddrs lists every address on every interface.
func (netlinkKernel) InterfaceAddrs() ([]netip.Addr, error) {
	list, err := retryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("netlink addr list: %w", err)
	}
	out := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if a.IPNet == nil {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// RouteGet asks the kernel which route it would use to reach a.
func (netlinkKernel) RouteGet(a netip.Addr) (kernelRoute, error) {
	routes, err := netlink.RouteGet(net.IP(a.AsSlice()))
	if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) {
		return kernelRoute{}, errNoRoute
	}
	if err != nil {
		return kernelRoute{}, fmt.Errorf("netlink route get: %w", err)
	}
	if len(routes) == 0 {
		return kernelRoute{}, errors.New("netlink route get: empty answer")
	}
	r := routes[0]
	return kernelRoute{Type: r.Type, LinkIndex: r.LinkIndex, HasGateway: r.Gw != nil || r.Via != nil}, nil
}

func toKernelLink(l netlink.Link) kernelLink {
	attrs := l.Attrs()
	kl := kernelLink{Index: attrs.Index, Name: attrs.Name, Detail: l.Type(), Kind: kindOther}
	switch v := l.(type) {
	case *netlink.Veth:
		kl.Kind = kindVeth
	case *netlink.Bridge:
		kl.Kind = kindBridge
	case *netlink.Dummy:
		kl.Kind = kindDummy
	case *netlink.Tuntap:
		kl.Kind = kindTun
		if v.Mode == netlink.TUNTAP_MODE_TAP || (v.Mode == 0 && attrs.EncapType == "ether") {
			kl.Kind = kindTap
		}
	default:
		if attrs.Flags&net.FlagLoopback != 0 || attrs.EncapType == "loopback" {
			kl.Kind = kindLoopback
		}
	}
	return kl
}

// Link describes the interface with the given index.
func (netlinkKernel) Link(index int) (kernelLink, error) {
	l, err := netlink.LinkByIndex(index)
	if err != nil {
		return kernelLink{}, fmt.Errorf("netlink link %d: %w", index, err)
	}
	return toKernelLink(l), nil
}

// BridgePorts lists the interfaces enslaved to the bridge.
func (netlinkKernel) BridgePorts(bridgeIndex int) ([]kernelLink, error) {
	links, err := retryDump(netlink.LinkList)
	if err != nil {
		return nil, fmt.Errorf("netlink link list: %w", err)
	}
	var ports []kernelLink
	for _, l := range links {
		if l.Attrs().MasterIndex == bridgeIndex {
			ports = append(ports, toKernelLink(l))
		}
	}
	return ports, nil
}

// DefaultRouteLinks returns the indexes of the links that an IPv4 or IPv6
// default route of the main table leaves by (every nexthop of a multipath
// route included).
func (netlinkKernel) DefaultRouteLinks() (map[int]bool, error) {
	out := make(map[int]bool)
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := retryDump(func() ([]netlink.Route, error) {
			return netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		})
		if err != nil {
			return nil, fmt.Errorf("netlink route list: %w", err)
		}
		for _, r := range routes {
			if r.Dst != nil {
				if ones, _ := r.Dst.Mask.Size(); ones != 0 {
					continue
				}
			}
			if r.LinkIndex > 0 {
				out[r.LinkIndex] = true
			}
			for _, nh := range r.MultiPath {
				if nh.LinkIndex > 0 {
					out[nh.LinkIndex] = true
				}
			}
		}
	}
	return out, nil
}
