package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// DefaultStagger is how long the Dialer waits for one address to answer
// before it starts dialing the next one (the previous attempt keeps going).
const DefaultStagger = 300 * time.Millisecond

// DefaultDialTimeout bounds a whole DialContext call (every attempt).
const DefaultDialTimeout = 30 * time.Second

// Resolver looks host names up. *net.Resolver satisfies it; tests inject a
// fake so they need no DNS.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config configures a Dialer. The zero Config is usable: the system
// resolver, this OS's LocalChecker, a 300 ms stagger and net.Dialer.
type Config struct {
	// Allow lists host names, addresses and CIDR prefixes that skip the
	// refusals (see AllowList).
	Allow []string
	// Resolver resolves names; nil means net.DefaultResolver.
	Resolver Resolver
	// Local tells whether an address is this machine's; nil means
	// NewLocalChecker().
	Local LocalChecker
	// Stagger is the delay before the next address is tried while earlier
	// attempts are still pending; 0 means DefaultStagger.
	Stagger time.Duration
	// Timeout bounds one DialContext call; 0 means DefaultDialTimeout.
	Timeout time.Duration
	// Dial opens a connection to one already-checked "ip:port" address;
	// nil means a net.Dialer. It is never called with a name.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// Dialer resolves, checks and dials on someone else's behalf. It is safe
// for concurrent use and holds no mutable state after NewDialer.
type Dialer struct {
	allow    *AllowList
	resolver Resolver
	local    LocalChecker
	stagger  time.Duration
	timeout  time.Duration
	dial     func(ctx context.Context, network, address string) (net.Conn, error)
}

// NewDialer builds a Dialer from cfg. It fails only on a malformed allow
// list entry.
func NewDialer(cfg Config) (*Dialer, error) {
	allow, err := ParseAllowList(cfg.Allow)
	if err != nil {
		return nil, err
	}
	d := &Dialer{
		allow:    allow,
		resolver: cfg.Resolver,
		local:    cfg.Local,
		stagger:  cfg.Stagger,
		timeout:  cfg.Timeout,
		dial:     cfg.Dial,
	}
	if d.resolver == nil {
		d.resolver = net.DefaultResolver
	}
	if d.local == nil {
		d.local = NewLocalChecker()
	}
	if d.stagger <= 0 {
		d.stagger = DefaultStagger
	}
	if d.timeout <= 0 {
		d.timeout = DefaultDialTimeout
	}
	if d.dial == nil {
		nd := &net.Dialer{KeepAlive: 30 * time.Second}
		d.dial = nd.DialContext
	}
	return d, nil
}

// RefusedError is returned when the guard refuses a target. Target is the
// host as asked (a name or an address), Addr the refused address (invalid
// when the name itself was refused, e.g. localhost-name) and Reason the
// stable reason code. Match it with errors.As.
type RefusedError struct {
	// Target is the host as asked: a lower-cased name or an address.
	Target string
	// Addr is the first refused address; invalid when the name itself was
	// refused (localhost-name).
	Addr netip.Addr
	// Reason is the stable refusal code.
	Reason Reason
}

// Error describes the refusal. It names the address; callers facing an
// untrusted client should send only Reason.
func (e *RefusedError) Error() string {
	if e.Addr.IsValid() {
		return fmt.Sprintf("netguard: %s refused: %s is %s", e.Target, e.Addr, e.Reason)
	}
	return fmt.Sprintf("netguard: %s refused: %s", e.Target, e.Reason)
}

// AddrVerdict is the judgement of one address.
type AddrVerdict struct {
	// Addr is the address judged (IPv4-mapped answers are unmapped).
	Addr netip.Addr
	// Reason is Allowed or the refusal code.
	Reason Reason
	// AllowListed is set when the allow list skipped the refusals.
	AllowListed bool
	// Detail says more for logs and operators (which route, which error);
	// never send it to an untrusted client.
	Detail string
}

// Decision is the judgement of a target: every address it resolved to and
// the verdict for the whole. A name is allowed only when every address is.
type Decision struct {
	// Target is the host as judged: the canonical address or the
	// lower-cased name.
	Target string
	// Allowed is true only when every address is allowed.
	Allowed bool
	// Reason is the refusal code: the first refused address's, or
	// localhost-name. Empty when allowed.
	Reason Reason
	// Addrs holds every resolved address in resolver order (empty when the
	// name was refused before lookup).
	Addrs []AddrVerdict
}

// Err returns the refusal as a *RefusedError, or nil when allowed.
func (dec Decision) Err() error {
	if dec.Allowed {
		return nil
	}
	e := &RefusedError{Target: dec.Target, Reason: dec.Reason}
	for _, v := range dec.Addrs {
		if v.Reason.Refused() {
			e.Addr = v.Addr
			break
		}
	}
	return e
}

// lookupNetwork maps a dial network to the resolver's network and the
// address family it may use.
func lookupNetwork(network string) (string, error) {
	switch network {
	case "tcp", "udp", "ip", "":
		return "ip", nil
	case "tcp4", "udp4":
		return "ip4", nil
	case "tcp6", "udp6":
		return "ip6", nil
	}
	return "", fmt.Errorf("netguard: unsupported network %q", network)
}

func familyOK(lookup string, a netip.Addr) bool {
	switch lookup {
	case "ip4":
		return a.Unmap().Is4()
	case "ip6":
		return a.Is6() && !a.Is4In6()
	}
	return true
}

// CheckAddr judges one address: the allow list, then Classify, then the
// LocalChecker (an error from it refuses with ReasonUnknown).
func (d *Dialer) CheckAddr(ctx context.Context, a netip.Addr) AddrVerdict {
	return d.checkAddr(ctx, a, false)
}

func (d *Dialer) checkAddr(ctx context.Context, a netip.Addr, nameAllowed bool) AddrVerdict {
	v := AddrVerdict{Addr: a}
	if !a.IsValid() {
		v.Reason = ReasonUnknown
		return v
	}
	if nameAllowed || d.allow.AllowsAddr(a) {
		v.AllowListed = true
		v.Detail = "allow list"
		return v
	}
	if r := Classify(a); r.Refused() {
		v.Reason = r
		return v
	}
	// The address itself, and any IPv4 address it carries (NAT64, 6to4,
	// Teredo, ...): a translator would deliver to that one.
	for _, x := range append([]netip.Addr{a.Unmap().WithZone("")}, Embedded4(a)...) {
		local, why, err := d.local.IsLocal(ctx, x)
		switch {
		case err != nil:
			v.Reason, v.Detail = ReasonUnknown, err.Error()
			return v
		case local:
			v.Reason, v.Detail = ReasonThisMachine, why
			return v
		}
	}
	return v
}

// Check resolves host once (unless it is an address) and judges every
// address. It returns an error only for a malformed host (wrapping
// ErrBadTarget), an unsupported network, or a failed lookup; a refusal is a
// Decision with Allowed false. Names "localhost" and "*.localhost" are
// refused before any lookup. network is a dial network ("tcp", "tcp4", ...)
// and limits the address family.
func (d *Dialer) Check(ctx context.Context, network, host string) (Decision, error) {
	lookup, err := lookupNetwork(network)
	if err != nil {
		return Decision{}, err
	}
	addr, name, err := parseHost(host)
	if err != nil {
		return Decision{}, err
	}
	if addr.IsValid() {
		if !familyOK(lookup, addr) {
			return Decision{}, fmt.Errorf("netguard: %s is not a %s address", addr, network)
		}
		v := d.checkAddr(ctx, addr, false)
		return Decision{Target: addr.String(), Allowed: !v.Reason.Refused(), Reason: v.Reason, Addrs: []AddrVerdict{v}}, nil
	}
	dec := Decision{Target: name}
	nameAllowed := d.allow.AllowsName(name)
	if !nameAllowed && isLocalhostName(name) {
		dec.Reason = ReasonLocalhostName
		return dec, nil
	}
	addrs, err := d.resolver.LookupNetIP(ctx, lookup, name)
	if err != nil {
		return Decision{}, fmt.Errorf("netguard: resolve %s: %w", name, err)
	}
	seen := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		if !familyOK(lookup, a) {
			continue
		}
		a = a.Unmap()
		if seen[a] {
			continue
		}
		seen[a] = true
		v := d.checkAddr(ctx, a, nameAllowed)
		if v.Reason.Refused() && dec.Reason == Allowed {
			dec.Reason = v.Reason
		}
		dec.Addrs = append(dec.Addrs, v)
	}
	if len(dec.Addrs) == 0 {
		return Decision{}, fmt.Errorf("netguard: resolve %s: no %s addresses", name, lookup)
	}
	dec.Allowed = dec.Reason == Allowed
	return dec, nil
}

// DialContext resolves the host of address ("host:port") once, checks
// every address, and when all are allowed dials them in the resolver's
// order: the next attempt starts as soon as one fails, or after the stagger
// (300 ms) while earlier ones are still pending; the first to connect wins
// and the others are closed. Only the checked addresses are dialed. A
// refusal is returned as *RefusedError. It has the signature of
// http.Transport.DialContext.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := splitTarget(address, 0)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	dec, err := d.Check(ctx, network, host)
	if err != nil {
		return nil, err
	}
	if !dec.Allowed {
		return nil, dec.Err()
	}
	addrs := make([]netip.Addr, len(dec.Addrs))
	for i, v := range dec.Addrs {
		addrs[i] = v.Addr
	}
	return d.dialStaggered(ctx, network, addrs, port)
}

type dialResult struct {
	conn net.Conn
	err  error
}

// dialStaggered dials the addresses in order as described on DialContext.
func (d *Dialer) dialStaggered(ctx context.Context, network string, addrs []netip.Addr, port uint16) (net.Conn, error) {
	ctx, cancel := context.WithCancel(ctx)
	results := make(chan dialResult, len(addrs))
	next, pending := 0, 0
	var errs []error
	timer := time.NewTimer(d.stagger)
	defer timer.Stop()
	start := func() {
		ap := netip.AddrPortFrom(addrs[next], port).String()
		next++
		pending++
		go func() {
			c, err := d.dial(ctx, network, ap)
			results <- dialResult{c, err}
		}()
		timer.Reset(d.stagger)
	}
	// finish cancels the losers and closes any that connect anyway.
	finish := func() {
		cancel()
		if pending == 0 {
			return
		}
		go func(n int) {
			for range n {
				if r := <-results; r.conn != nil {
					_ = r.conn.Close()
				}
			}
		}(pending)
	}
	start()
	for {
		select {
		case r := <-results:
			pending--
			if r.err == nil {
				finish()
				return r.conn, nil
			}
			errs = append(errs, r.err)
			if next < len(addrs) {
				start()
			} else if pending == 0 {
				finish()
				return nil, fmt.Errorf("netguard: dial: %w", errors.Join(errs...))
			}
		case <-timer.C:
			if next < len(addrs) {
				start()
			}
		case <-ctx.Done():
			finish()
			return nil, fmt.Errorf("netguard: dial: %w", errors.Join(append(errs, ctx.Err())...))
		}
	}
}
