package forward

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/bettercompute/bettercompute/internal/netguard"
)

// UpstreamError is CheckUpstream's refusal: the upstream is not this
// machine, or this machine cannot tell. Its Error is one line naming the
// address and what to set, for the bastion's output.
type UpstreamError struct {
	// EnvVar is the variable the person sets (OLLAMA_ADDR, ...).
	EnvVar string
	// Upstream is the configured host:port.
	Upstream string
	// Addr is the refused address ("" when the upstream itself is
	// malformed or does not resolve).
	Addr string
	// Problem says what is wrong, e.g. "is not this machine".
	Problem string
	// Err is the underlying error, if any (resolver, local check).
	Err error
}

// Error is one line: which address is not used and what to set.
func (e *UpstreamError) Error() string {
	target := e.Upstream
	if e.Addr != "" && e.Addr != e.Upstream {
		target = fmt.Sprintf("%s (%s)", e.Upstream, e.Addr)
	}
	msg := fmt.Sprintf("%s points at %s, which %s; set %s to a loopback or local address",
		e.EnvVar, target, e.Problem, e.EnvVar)
	return oneLine(msg)
}

// Unwrap returns the underlying error.
func (e *UpstreamError) Unwrap() error { return e.Err }

// oneLine replaces control characters so a message stays one line.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}

// CheckUpstream resolves upstream (host:port, an address or a name) once
// and requires every address it names to be this machine: loopback, or an
// address local says is this machine's own. It returns the checked
// addresses in resolver order; the forward dials only those. Any other
// answer, a lookup failure, or a local check that cannot tell, is an
// *UpstreamError.
func CheckUpstream(ctx context.Context, k Kind, upstream string, local netguard.LocalChecker, r netguard.Resolver) ([]netip.AddrPort, error) {
	refuse := func(addr, problem string, err error) error {
		return &UpstreamError{EnvVar: k.EnvVar(), Upstream: upstream, Addr: addr, Problem: problem, Err: err}
	}
	if !k.valid() {
		return nil, fmt.Errorf("forward: unknown kind %q", k)
	}
	host, port, err := splitUpstream(upstream)
	if err != nil {
		return nil, refuse("", "is not host:port", err)
	}
	addrs, err := resolveUpstream(ctx, host, r)
	if err != nil {
		return nil, refuse("", "does not resolve", err)
	}
	if len(addrs) == 0 {
		return nil, refuse("", "does not resolve", nil)
	}
	out := make([]netip.AddrPort, 0, len(addrs))
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a, port)
		if problem, err := checkLocal(ctx, a, local); problem != "" {
			return nil, refuse(ap.String(), problem, err)
		}
		if !slices.Contains(out, ap) {
			out = append(out, ap)
		}
	}
	return out, nil
}

// splitUpstream parses host:port with a numeric port in 1..65535.
func splitUpstream(upstream string) (string, uint16, error) {
	host, p, err := net.SplitHostPort(upstream)
	if err != nil {
		return "", 0, fmt.Errorf("forward: parse upstream: %w", err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("forward: upstream port %q is not 1-65535", p)
	}
	if host == "" {
		return "", 0, errors.New("forward: upstream has no host")
	}
	return host, uint16(n), nil
}

// resolveUpstream returns host as an address, or the addresses it
// resolves to (IPv4-mapped answers unmapped).
func resolveUpstream(ctx context.Context, host string, r netguard.Resolver) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("forward: resolve %s: %w", host, err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.Unmap())
	}
	return out, nil
}

// checkLocal returns "" when a is this machine, else the problem.
// Loopback is always this machine; unspecified and multicast addresses are
// never a server to dial.
func checkLocal(ctx context.Context, a netip.Addr, local netguard.LocalChecker) (string, error) {
	switch {
	case !a.IsValid(), a.IsUnspecified(), a.IsMulticast():
		return "is not this machine", nil
	case a.IsLoopback():
		return "", nil
	}
	ok, _, err := local.IsLocal(ctx, a)
	if err != nil {
		return "this machine cannot confirm is its own", fmt.Errorf("forward: local check: %w", err)
	}
	if !ok {
		return "is not this machine", nil
	}
	return "", nil
}
