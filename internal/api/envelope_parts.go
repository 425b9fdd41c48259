package api

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// Proxies is the set of trusted proxies, as addresses or prefixes.
type Proxies []netip.Prefix

// ParseProxies parses a list of addresses and CIDRs.
func ParseProxies(list []string) (Proxies, error) {
	var out Proxies
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: not an address or CIDR", s)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

func (p Proxies) trusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, pr := range p {
		if pr.Contains(a) {
			return true
		}
	}
	return false
}

// ClientAddr returns the caller's address: the socket peer, unless the peer
// is a trusted proxy, in which case X-Forwarded-For is read right to left,
// skipping trusted hops, and the first untrusted hop is the client. A
// malformed hop or a missing header leaves it unset (""), never the
// proxy's own address.
func (p Proxies) ClientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return ""
	}
	peer, err := netip.ParseAddr(host)
	if err != nil {
		return ""
	}
	peer = peer.Unmap()
	if !p.trusted(peer) {
		return peer.String()
	}
	hops := r.Header.Values("X-Forwarded-For")
	if len(hops) == 0 {
		return ""
	}
	parts := strings.Split(strings.Join(hops, ","), ",")
	for i := len(parts) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(parts[i]))
		if err != nil {
			return ""
		}
		a = a.Unmap()
		if !p.trusted(a) {
			return a.String()
		}
	}
	return ""
}

func originOf(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "", errors.New("base URL must be absolute, such as https://bc.example.com")
	}
	return u.Scheme + "://" + u.Host, nil
}

// RateLimits are token buckets per identity and method class.
type RateLimits struct {
	ReadPerSecond, ReadBurst     float64
	MutatePerSecond, MutateBurst float64
}

// DefaultRateLimits allow 50 reads/s (burst 100) and 10 mutations/s
// (burst 20) per identity.
var DefaultRateLimits = RateLimits{ReadPerSecond: 50, ReadBurst: 100, MutatePerSecond: 10, MutateBurst: 20}

type bucket struct {
	tokens float64
	last   time.Time
}

type limiter struct {
	cfg     RateLimits
	clk     clock.Clock
	mu      sync.Mutex
	buckets map[string]*bucket
}

func newLimiter(cfg RateLimits, clk clock.Clock) *limiter {
	if cfg == (RateLimits{}) {
		cfg = DefaultRateLimits
	}
	return &limiter{cfg: cfg, clk: clk, buckets: map[string]*bucket{}}
}

// take spends a token of identity's class; it returns 0 when allowed, or
// how long until a token is available.
func (l *limiter) take(identity string, mutates bool) time.Duration {
	rate, burst, class := l.cfg.ReadPerSecond, l.cfg.ReadBurst, "r"
	if mutates {
		rate, burst, class = l.cfg.MutatePerSecond, l.cfg.MutateBurst, "m"
	}
	if rate <= 0 {
		return 0
	}
	now := l.clk.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := class + identity
	b := l.buckets[k]
	if b == nil {
		b = &bucket{tokens: burst, last: now}
		l.buckets[k] = b
	}
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = min(burst, b.tokens+el*rate)
	}
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return 0
	}
	return time.Duration((1 - b.tokens) / rate * float64(time.Second))
}

// denialLimiter lets at most 10 denial audit rows a minute through per key.
type denialLimiter struct {
	clk  clock.Clock
	mu   sync.Mutex
	seen map[string][]time.Time
}

func newDenialLimiter(clk clock.Clock) *denialLimiter {
	return &denialLimiter{clk: clk, seen: map[string][]time.Time{}}
}

func (d *denialLimiter) allow(key string) bool {
	now := d.clk.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.seen) > 10000 {
		d.seen = map[string][]time.Time{}
	}
	ts := d.seen[key]
	for len(ts) > 0 && now.Sub(ts[0]) > time.Minute {
		ts = ts[1:]
	}
	if len(ts) >= 10 {
		d.seen[key] = ts
		return false
	}
	d.seen[key] = append(ts, now)
	return true
}
