// Package netguard is the egress guard: the one place that decides whether
// Better Compute may open a connection on someone else's behalf.
//
// Sandboxes, coder runs and a bastion's egress lane must reach the public
// internet and nothing on this machine or its network that nobody named.
// Everything that dials for someone else goes through this package:
//
//   - Classify judges a single address against the IANA special-purpose
//     registries and the other ranges that are not the public internet
//     (loopback, private, CGNAT, ULA, link-local and cloud metadata, the
//     deprecated IPv6 forms, documentation ranges, ...), decoding the IPv4
//     address inside IPv4-mapped, IPv4-compatible, NAT64, 6to4 and Teredo
//     addresses. It is pure and needs no system access.
//   - A LocalChecker asks the operating system whether an address is this
//     machine's own: an interface address, and on Linux any address the
//     kernel's routing tables deliver here or route straight onto a link that
//     stays on this machine (a veth, or a bridge of veths, taps and dummies).
//   - Dialer resolves a name once, checks every address, refuses the whole
//     name when any address is refused (fail closed), and dials only the
//     checked addresses, in order, staggered by 300 ms.
//   - Proxy is an HTTP CONNECT and absolute-form HTTP forwarding proxy that
//     dials through a Dialer, logs one line per connection and counts
//     connections and bytes in Prometheus counters.
//   - NewHTTPClient returns an http.Client whose every dial and every
//     redirect is checked.
//
// Refusals carry a stable lowercase reason code (see the Reason constants);
// callers can match them with errors.As on *RefusedError. When the guard
// cannot tell, it refuses with ReasonUnknown.
package netguard
