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

	"golang.org/x/time/rate"

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

// RateLimits are token buckets per identity and method class, and one per
// caller address for failed authentications.
type RateLimits struct {
	ReadPerSecond, ReadBurst     float64
	MutatePerSecond, MutateBurst float64
	// FailedAuthPerSecond and FailedAuthBurst bound failed
	// authentications per caller address (zero: 1/s, burst 10).
	FailedAuthPerSecond, FailedAuthBurst float64
}

// DefaultRateLimits allow 50 reads/s (burst 100) and 10 mutations/s
// (burst 20) per identity, and 1 failed authentication/s (burst 10) per
// caller address.
var DefaultRateLimits = RateLimits{ReadPerSecond: 50, ReadBurst: 100, MutatePerSecond: 10, MutateBurst: 20, FailedAuthPerSecond: 1, FailedAuthBurst: 10}

// failLimiter is a token bucket per caller address that only failures
// spend: an address with no token left is refused before it may try
// again.
type failLimiter struct {
	every rate.Limit
	burst int
	clk   clock.Clock
	mu    sync.Mutex
	addrs map[string]*rate.Limiter
}

func newFailLimiter(cfg RateLimits, clk clock.Clock) *failLimiter {
	perSecond, burst := cfg.FailedAuthPerSecond, cfg.FailedAuthBurst
	if perSecond <= 0 || burst < 1 {
		perSecond, burst = DefaultRateLimits.FailedAuthPerSecond, DefaultRateLimits.FailedAuthBurst
	}
	return &failLimiter{every: rate.Limit(perSecond), burst: int(burst), clk: clk, addrs: map[string]*rate.Limiter{}}
}

func (f *failLimiter) get(addr string) *rate.Limiter {
	l := f.addrs[addr]
	if l == nil {
		if len(f.addrs) >= 10000 {
			clear(f.addrs)
		}
		l = rate.NewLimiter(f.every, f.burst)
		f.addrs[addr] = l
	}
	return l
}

// blocked returns how long addr must wait before it may try to
// authenticate again (0: it may now).
func (f *failLimiter) blocked(addr string) time.Duration {
	now := f.clk.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.addrs[addr]
	if !ok {
		return 0
	}
	if tokens := l.TokensAt(now); tokens < 1 {
		return time.Duration((1 - tokens) / float64(f.every) * float64(time.Second))
	}
	return 0
}

// fail spends one of addr's tokens.
func (f *failLimiter) fail(addr string) {
	now := f.clk.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.get(addr).AllowN(now, 1)
}

// limiter is a token bucket (golang.org/x/time/rate) per identity and
// method class: reads and mutations spend separate buckets.
type limiter struct {
	cfg     RateLimits
	clk     clock.Clock
	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

func newLimiter(cfg RateLimits, clk clock.Clock) *limiter {
	if cfg == (RateLimits{}) {
		cfg = DefaultRateLimits
	}
	return &limiter{cfg: cfg, clk: clk, buckets: map[string]*rate.Limiter{}}
}

// take spends a token of identity's class; it returns 0 when allowed, or
// how long until a token is available. A class with no rate is not
// limited.
func (l *limiter) take(identity string, mutates bool) time.Duration {
	perSecond, burst, class := l.cfg.ReadPerSecond, l.cfg.ReadBurst, "r"
	if mutates {
		perSecond, burst, class = l.cfg.MutatePerSecond, l.cfg.MutateBurst, "m"
	}
	if perSecond <= 0 {
		return 0
	}
	now := l.clk.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := class + identity
	b := l.buckets[k]
	if b == nil {
		b = rate.NewLimiter(rate.Limit(perSecond), int(burst))
		l.buckets[k] = b
	}
	if b.AllowN(now, 1) {
		return 0
	}
	return time.Duration((1 - b.TokensAt(now)) / perSecond * float64(time.Second))
}

// denialLimiter lets at most 10 denial audit rows a minute through per key.
// It is a sliding window, not a token bucket (golang.org/x/time/rate):
// its bound is "at most 10 in any minute", which a bucket refilling over
// the minute would exceed (up to 19 in one minute), so it stays a window.
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
