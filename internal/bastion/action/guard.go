package action

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/netguard"
)

// dialFunc dials one checked "ip:port" address.
type dialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// guard judges destinations for the machine as it is anchored now.
type guard struct {
	anchored func() bool
	resolver netguard.Resolver
	local    netguard.LocalChecker
	// strict is the egress guard of an unanchored machine.
	strict *netguard.Dialer
	dial   dialFunc
}

// newGuard builds the guard; dial dials a checked address (nil: a
// net.Dialer).
func newGuard(anchored func() bool, res netguard.Resolver, local netguard.LocalChecker, dial dialFunc) (*guard, error) {
	if anchored == nil {
		anchored = func() bool { return false }
	}
	if res == nil {
		res = net.DefaultResolver
	}
	if local == nil {
		local = netguard.NewLocalChecker()
	}
	if dial == nil {
		nd := &net.Dialer{Timeout: 30 * time.Second}
		dial = nd.DialContext
	}
	strict, err := netguard.NewDialer(netguard.Config{Resolver: res, Local: local, Dial: dial})
	if err != nil {
		return nil, fmt.Errorf("action: egress guard: %w", err)
	}
	return &guard{anchored: anchored, resolver: res, local: local, strict: strict, dial: dial}, nil
}

// cloudMetadata are metadata services on addresses Classify does not call
// link-local (Alibaba's in CGNAT space, AWS's IPv6 one in ULA space).
var cloudMetadata = []netip.Addr{netip.MustParseAddr("100.100.100.200"), netip.MustParseAddr("fd00:ec2::254")}

// judge returns why a is refused, or netguard.Allowed. Unanchored: the
// egress guard's whole check (Classify, the embedded IPv4 address of
// NAT64, 6to4 and the other forms, this machine). Anchored: only
// loopback, unspecified, link-local, a cloud metadata address or this
// machine, also inside an embedded IPv4 address.
func (g *guard) judge(ctx context.Context, a netip.Addr) netguard.Reason {
	if !g.anchored() {
		return g.strict.CheckAddr(ctx, a).Reason
	}
	if !a.IsValid() {
		return netguard.ReasonUnknown
	}
	all := append([]netip.Addr{a.Unmap().WithZone("")}, netguard.Embedded4(a)...)
	for _, x := range all {
		switch r := netguard.Classify(x); r {
		case netguard.ReasonLoopback, netguard.ReasonUnspecified, netguard.ReasonLinkLocal, netguard.ReasonCloudMetadata:
			return r
		}
		for _, m := range cloudMetadata {
			if x == m {
				return netguard.ReasonCloudMetadata
			}
		}
	}
	for _, x := range all {
		local, _, err := g.local.IsLocal(ctx, x)
		if err != nil {
			return netguard.ReasonUnknown
		}
		if local {
			return netguard.ReasonThisMachine
		}
	}
	return netguard.Allowed
}

// check resolves host (unless it is an address) and judges every address:
// one refused address refuses the host with ReasonDestinationPrivate. It
// returns the checked addresses, in the resolver's order.
func (g *guard) check(ctx context.Context, host string) ([]netip.Addr, error) {
	if isLocalhostName(host) {
		return nil, refuse(ReasonDestinationPrivate, host+" (localhost-name)")
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		res, err := g.resolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, fmt.Errorf("action: resolve %s: %w", host, err)
		}
		addrs = res
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("action: resolve %s: no addresses", host)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		a = a.Unmap()
		if why := g.judge(ctx, a); why.Refused() {
			return nil, refuse(ReasonDestinationPrivate, host+" ("+why.String()+")")
		}
		out = append(out, a)
	}
	return out, nil
}

// dialChecked is the anchored machine's dial: it checks the host of
// address as check does and dials only the checked addresses, in order.
func (g *guard) dialChecked(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("action: dial %s: %w", address, err)
	}
	addrs, err := g.check(ctx, host)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, a := range addrs {
		c, err := g.dial(ctx, network, net.JoinHostPort(a.String(), port))
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("action: dial %s: %w", host, errors.Join(errs...))
}

// hostLog records the hosts a fetch reached (redirects included).
type hostLog struct {
	mu    sync.Mutex
	hosts []string
}

func (h *hostLog) add(host string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, x := range h.hosts {
		if x == host {
			return
		}
	}
	h.hosts = append(h.hosts, host)
}

// client returns an HTTP client for fetching inputs: unanchored, the
// egress guard's own (netguard.NewHTTPClient: every address checked, the
// checked one dialled, every redirect judged); anchored, the same shape
// on the anchored rule. Every redirect's host is recorded in hosts.
func (g *guard) client(hosts *hostLog) *http.Client {
	var c *http.Client
	if !g.anchored() {
		c = netguard.NewHTTPClient(g.strict)
	} else {
		c = &http.Client{
			Transport: &http.Transport{Proxy: nil, DialContext: g.dialChecked, TLSHandshakeTimeout: 10 * time.Second,
				ResponseHeaderTimeout: 30 * time.Second, MaxResponseHeaderBytes: 64 << 10},
			CheckRedirect: func(req *http.Request, via []*http.Request) error {
				if len(via) > netguard.MaxRedirects || (req.URL.Scheme != "http" && req.URL.Scheme != "https") {
					return errors.New("action: redirect refused")
				}
				_, err := g.check(req.Context(), req.URL.Hostname())
				return err
			},
		}
	}
	inner := c.CheckRedirect
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		hosts.add(req.URL.Hostname())
		return inner(req, via)
	}
	return c
}
