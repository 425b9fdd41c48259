package netguard

import (
	"context"
	"errors"
	"net/netip"
	"testing"
)

// fakeKernel is a scripted kernel for the route checker's decision logic.
type fakeKernel struct {
	addrs      []netip.Addr
	addrsErr   error
	routes     map[netip.Addr]kernelRoute
	routeErr   error
	links      map[int]kernelLink
	linkErr    error
	ports      map[int][]kernelLink
	portsErr   error
	defaults   map[int]bool
	defaultErr error
}

func (k *fakeKernel) InterfaceAddrs() ([]netip.Addr, error) { return k.addrs, k.addrsErr }
func (k *fakeKernel) RouteGet(a netip.Addr) (kernelRoute, error) {
	if k.routeErr != nil {
		return kernelRoute{}, k.routeErr
	}
	r, ok := k.routes[a]
	if !ok {
		return kernelRoute{}, errNoRoute
	}
	return r, nil
}
func (k *fakeKernel) Link(i int) (kernelLink, error) {
	if k.linkErr != nil {
		return kernelLink{}, k.linkErr
	}
	l, ok := k.links[i]
	if !ok {
		return kernelLink{}, errors.New("no such link")
	}
	return l, nil
}
func (k *fakeKernel) BridgePorts(i int) ([]kernelLink, error) { return k.ports[i], k.portsErr }
func (k *fakeKernel) DefaultRouteLinks() (map[int]bool, error) {
	return k.defaults, k.defaultErr
}

var (
	tgt     = netip.MustParseAddr("11.22.33.44")
	lnkEth  = kernelLink{Index: 2, Name: "eth0", Kind: kindOther, Detail: "device"}
	lnkVeth = kernelLink{Index: 3, Name: "veth1", Kind: kindVeth}
	lnkTap  = kernelLink{Index: 4, Name: "tap0", Kind: kindTap}
	lnkDum  = kernelLink{Index: 5, Name: "dummy0", Kind: kindDummy}
	lnkBr   = kernelLink{Index: 6, Name: "br0", Kind: kindBridge}
	lnkTun  = kernelLink{Index: 7, Name: "tun0", Kind: kindTun}
	lnkLo   = kernelLink{Index: 1, Name: "lo", Kind: kindLoopback}
	lnkBond = kernelLink{Index: 8, Name: "bond0", Kind: kindOther, Detail: "bond"}
	lnkVlan = kernelLink{Index: 9, Name: "eth0.5", Kind: kindOther, Detail: "vlan"}
	allLnks = map[int]kernelLink{1: lnkLo, 2: lnkEth, 3: lnkVeth, 4: lnkTap, 5: lnkDum, 6: lnkBr, 7: lnkTun, 8: lnkBond, 9: lnkVlan}
)

func direct(link int) map[netip.Addr]kernelRoute {
	return map[netip.Addr]kernelRoute{tgt: {Type: rtnUnicast, LinkIndex: link}}
}

// TestRouteCheckerDecisions covers each "this machine" rule on a scripted
// kernel.
func TestRouteCheckerDecisions(t *testing.T) {
	cases := []struct {
		name string
		k    fakeKernel
		want bool
	}{
		{"interface address (public)", fakeKernel{addrs: []netip.Addr{tgt}}, true},
		{"interface address as mapped", fakeKernel{addrs: []netip.Addr{netip.MustParseAddr("::ffff:11.22.33.44")}}, true},
		{"local route (AnyIP)", fakeKernel{routes: map[netip.Addr]kernelRoute{tgt: {Type: rtnLocal, LinkIndex: 1}}}, true},
		{"broadcast route", fakeKernel{routes: map[netip.Addr]kernelRoute{tgt: {Type: rtnBroadcast, LinkIndex: 2}}}, true},
		{"anycast route", fakeKernel{routes: map[netip.Addr]kernelRoute{tgt: {Type: rtnAnycast, LinkIndex: 2}}}, true},
		{"multicast route", fakeKernel{routes: map[netip.Addr]kernelRoute{tgt: {Type: rtnMulticast, LinkIndex: 2}}}, true},
		{"via gateway leaves", fakeKernel{routes: map[netip.Addr]kernelRoute{tgt: {Type: rtnUnicast, LinkIndex: 3, HasGateway: true}}, links: allLnks}, false},
		{"no route", fakeKernel{}, false},
		{"direct onto veth", fakeKernel{routes: direct(3), links: allLnks}, true},
		{"direct onto tap", fakeKernel{routes: direct(4), links: allLnks}, true},
		{"direct onto dummy", fakeKernel{routes: direct(5), links: allLnks}, true},
		{"direct onto lo", fakeKernel{routes: direct(1), links: allLnks}, true},
		{"direct onto NIC (LAN)", fakeKernel{routes: direct(2), links: allLnks}, false},
		{"direct onto tun (VPN leaves)", fakeKernel{routes: direct(7), links: allLnks}, false},
		{"direct onto default-route veth", fakeKernel{routes: direct(3), links: allLnks, defaults: map[int]bool{3: true}}, false},
		{"bridge of veth, tap, dummy", fakeKernel{routes: direct(6), links: allLnks, ports: map[int][]kernelLink{6: {lnkVeth, lnkTap, lnkDum}}}, true},
		{"bridge with no ports", fakeKernel{routes: direct(6), links: allLnks}, true},
		{"bridge with a NIC", fakeKernel{routes: direct(6), links: allLnks, ports: map[int][]kernelLink{6: {lnkVeth, lnkEth}}}, false},
		{"bridge with a bond", fakeKernel{routes: direct(6), links: allLnks, ports: map[int][]kernelLink{6: {lnkTap, lnkBond}}}, false},
		{"bridge with a VLAN", fakeKernel{routes: direct(6), links: allLnks, ports: map[int][]kernelLink{6: {lnkVlan}}}, false},
		{"bridge with a tun", fakeKernel{routes: direct(6), links: allLnks, ports: map[int][]kernelLink{6: {lnkTun}}}, false},
		{"default-route bridge of veths", fakeKernel{routes: direct(6), links: allLnks, ports: map[int][]kernelLink{6: {lnkVeth}}, defaults: map[int]bool{6: true}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, why, err := routeChecker{k: &tc.k}.IsLocal(context.Background(), tgt)
			if err != nil {
				t.Fatalf("IsLocal: %v", err)
			}
			if got != tc.want {
				t.Fatalf("IsLocal = %v (%s), want %v", got, why, tc.want)
			}
			if got && why == "" {
				t.Fatalf("IsLocal = true with no description")
			}
		})
	}
}

// TestRouteCheckerErrorsRefuseUnknown: whenever the kernel cannot be asked
// the checker errs, and the Dialer refuses with "unknown".
func TestRouteCheckerErrorsRefuseUnknown(t *testing.T) {
	boom := errors.New("netlink: boom")
	cases := []struct {
		name string
		k    fakeKernel
	}{
		{"addr list", fakeKernel{addrsErr: boom}},
		{"route get", fakeKernel{routeErr: boom}},
		{"unexpected route type", fakeKernel{routes: map[netip.Addr]kernelRoute{tgt: {Type: 9}}}},
		{"default routes", fakeKernel{routes: direct(3), links: allLnks, defaultErr: boom}},
		{"link", fakeKernel{routes: direct(3), linkErr: boom}},
		{"bridge ports", fakeKernel{routes: direct(6), links: allLnks, portsErr: boom}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := (routeChecker{k: &tc.k}).IsLocal(context.Background(), tgt); err == nil {
				t.Fatalf("IsLocal: no error")
			}
			d := newTestDialer(t, Config{Local: routeChecker{k: &tc.k}})
			v := d.CheckAddr(context.Background(), tgt)
			if v.Reason != ReasonUnknown {
				t.Fatalf("CheckAddr reason = %q, want %q", v.Reason, ReasonUnknown)
			}
		})
	}
}

// TestAddrCheckerFallback: the portable checker knows interface addresses
// only, and errs (refusing) when it cannot list them.
func TestAddrCheckerFallback(t *testing.T) {
	c := addrChecker{addrs: func() ([]netip.Addr, error) { return []netip.Addr{tgt}, nil }}
	if got, _, err := c.IsLocal(context.Background(), tgt); err != nil || !got {
		t.Fatalf("own address: got %v, %v", got, err)
	}
	if got, _, err := c.IsLocal(context.Background(), netip.MustParseAddr("8.8.8.8")); err != nil || got {
		t.Fatalf("other address: got %v, %v", got, err)
	}
	bad := addrChecker{addrs: func() ([]netip.Addr, error) { return nil, errors.New("boom") }}
	d := newTestDialer(t, Config{Local: bad})
	if v := d.CheckAddr(context.Background(), tgt); v.Reason != ReasonUnknown {
		t.Fatalf("reason = %q, want %q", v.Reason, ReasonUnknown)
	}
}

// TestInterfaceAddrCheckerSeesLoopback: the real fallback finds 127.0.0.1
// on this machine's interfaces.
func TestInterfaceAddrCheckerSeesLoopback(t *testing.T) {
	got, _, err := NewInterfaceAddrChecker().IsLocal(context.Background(), netip.MustParseAddr("127.0.0.1"))
	if err != nil || !got {
		t.Fatalf("IsLocal(127.0.0.1) = %v, %v; want true", got, err)
	}
}
