package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeResolver answers from a table and counts lookups. A name mapped to
// several answers gives the next answer on each lookup (the last repeats).
type fakeResolver struct {
	mu      sync.Mutex
	answers map[string][][]netip.Addr
	calls   map[string]int
}

func newFakeResolver(m map[string][]string) *fakeResolver {
	r := &fakeResolver{answers: map[string][][]netip.Addr{}, calls: map[string]int{}}
	for name, addrs := range m {
		r.add(name, addrs...)
	}
	return r
}

// add appends one answer for name.
func (r *fakeResolver) add(name string, addrs ...string) {
	var ans []netip.Addr
	for _, a := range addrs {
		ans = append(ans, netip.MustParseAddr(a))
	}
	r.answers[name] = append(r.answers[name], ans)
}

func (r *fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.calls[host]
	r.calls[host]++
	ans, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	if n >= len(ans) {
		n = len(ans) - 1
	}
	var out []netip.Addr
	for _, a := range ans[n] {
		if network == "ip4" && !a.Is4() || network == "ip6" && !a.Is6() {
			continue
		}
		out = append(out, a)
	}
	return out, nil
}

func (r *fakeResolver) lookups(host string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[host]
}

// fakeLocal says the listed addresses are this machine's.
type fakeLocal map[netip.Addr]bool

func (f fakeLocal) IsLocal(_ context.Context, a netip.Addr) (bool, string, error) {
	if f[a] {
		return true, "fake", nil
	}
	return false, "", nil
}

func newTestDialer(t testing.TB, cfg Config) *Dialer {
	t.Helper()
	if cfg.Resolver == nil {
		cfg.Resolver = newFakeResolver(nil)
	}
	if cfg.Local == nil {
		cfg.Local = fakeLocal{}
	}
	if cfg.Dial == nil {
		cfg.Dial = func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("test dialer: dialing is not expected here")
		}
	}
	d, err := NewDialer(cfg)
	if err != nil {
		t.Fatalf("NewDialer: %v", err)
	}
	return d
}

// TestCheckRefusesLocalhostNamesBeforeLookup: localhost and *.localhost, in
// any case, with a trailing dot, are refused without asking the resolver.
func TestCheckRefusesLocalhostNamesBeforeLookup(t *testing.T) {
	res := newFakeResolver(map[string][]string{"localhost.example.com": {"8.8.8.8"}, "notlocalhost": {"8.8.8.8"}})
	d := newTestDialer(t, Config{Resolver: res})
	for _, name := range []string{"localhost", "LOCALHOST", "localhost.", "foo.localhost", "a.b.LocalHost."} {
		dec, err := d.Check(context.Background(), "tcp", name)
		if err != nil {
			t.Fatalf("Check(%q): %v", name, err)
		}
		if dec.Allowed || dec.Reason != ReasonLocalhostName {
			t.Errorf("Check(%q) = %v %q, want refused %q", name, dec.Allowed, dec.Reason, ReasonLocalhostName)
		}
		if n := res.lookups(normName(name)); n != 0 {
			t.Errorf("Check(%q) looked the name up %d times", name, n)
		}
	}
	for _, name := range []string{"localhost.example.com", "notlocalhost"} {
		dec, err := d.Check(context.Background(), "tcp", name)
		if err != nil || !dec.Allowed {
			t.Errorf("Check(%q) = %+v, %v; want allowed", name, dec, err)
		}
	}
}

// TestCheckRefusesWholeNameWhenAnyAddressIsRefused: a name with a public
// and a private address is refused (fail closed), with the private
// address's reason, and nothing is dialed.
func TestCheckRefusesWholeNameWhenAnyAddressIsRefused(t *testing.T) {
	res := newFakeResolver(map[string][]string{"mixed.example": {"8.8.8.8", "10.0.0.1", "2001:4860::1"}})
	var dialed atomic.Int32
	d := newTestDialer(t, Config{Resolver: res, Dial: func(context.Context, string, string) (net.Conn, error) {
		dialed.Add(1)
		return nil, errors.New("no")
	}})
	dec, err := d.Check(context.Background(), "tcp", "mixed.example")
	if err != nil {
		t.Fatal(err)
	}
	if dec.Allowed || dec.Reason != ReasonPrivate || len(dec.Addrs) != 3 {
		t.Fatalf("Check = %+v; want refused private with 3 addresses", dec)
	}
	_, err = d.DialContext(context.Background(), "tcp", "mixed.example:443")
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("DialContext error %v is not a *RefusedError", err)
	}
	if re.Reason != ReasonPrivate || re.Addr != netip.MustParseAddr("10.0.0.1") || re.Target != "mixed.example" {
		t.Fatalf("RefusedError = %+v", re)
	}
	if dialed.Load() != 0 {
		t.Fatalf("dialed %d times for a refused name", dialed.Load())
	}
}

// TestCheckThisMachine: an address the LocalChecker claims is refused as
// this-machine, even when it is public.
func TestCheckThisMachine(t *testing.T) {
	own := netip.MustParseAddr("11.22.33.44")
	d := newTestDialer(t, Config{Local: fakeLocal{own: true}})
	if v := d.CheckAddr(context.Background(), own); v.Reason != ReasonThisMachine {
		t.Fatalf("reason = %q, want %q", v.Reason, ReasonThisMachine)
	}
	if v := d.CheckAddr(context.Background(), netip.MustParseAddr("::ffff:11.22.33.44")); v.Reason != ReasonThisMachine {
		t.Fatalf("mapped: reason = %q, want %q", v.Reason, ReasonThisMachine)
	}
}

// TestCheckThisMachineEmbedded: with 8.8.8.8 this machine's own address,
// every IPv6 form that carries it (NAT64, 6to4, Teredo server or client)
// is refused as this-machine; the same forms around another public
// address stay allowed.
func TestCheckThisMachineEmbedded(t *testing.T) {
	own := netip.MustParseAddr("8.8.8.8")
	d := newTestDialer(t, Config{Local: fakeLocal{own: true}})
	for _, s := range []string{
		"::ffff:8.8.8.8",            // IPv4-mapped
		"64:ff9b::808:808",          // NAT64
		"2002:808:808::1",           // 6to4
		"2001:0:808:808::f6f6:f6f6", // Teredo server (client 9.9.9.9)
		"2001:0:101:101::f7f7:f7f7", // Teredo client 8.8.8.8 (XOR 0xff)
	} {
		if v := d.CheckAddr(context.Background(), netip.MustParseAddr(s)); v.Reason != ReasonThisMachine {
			t.Errorf("%s: reason = %q, want %q", s, v.Reason, ReasonThisMachine)
		}
	}
	for _, s := range []string{"64:ff9b::909:909", "2002:909:909::1", "::ffff:9.9.9.9", "2001:0:909:909::f6f6:f6f6"} {
		if v := d.CheckAddr(context.Background(), netip.MustParseAddr(s)); v.Reason.Refused() {
			t.Errorf("%s: refused %q, want allowed", s, v.Reason)
		}
	}
	// The deprecated IPv4-compatible and -translated forms are refused
	// whatever IPv4 address they carry, before the this-machine check.
	for s, want := range map[string]Reason{
		"::808:808": ReasonIPv4Compatible, "::909:909": ReasonIPv4Compatible,
		"::ffff:0:808:808": ReasonIPv4Translated, "::ffff:0:909:909": ReasonIPv4Translated,
	} {
		if v := d.CheckAddr(context.Background(), netip.MustParseAddr(s)); v.Reason != want {
			t.Errorf("%s: reason = %q, want %q", s, v.Reason, want)
		}
	}
}

// TestAllowListSkipsRefusalsForExactlyThose.
func TestAllowListSkipsRefusalsForExactlyThose(t *testing.T) {
	res := newFakeResolver(map[string][]string{
		"nas.lan":     {"192.168.1.5"},
		"other.lan":   {"192.168.1.6"},
		"half.lan":    {"10.1.2.3", "192.168.1.7"},
		"printer.lan": {"fd00::5"},
	})
	own := netip.MustParseAddr("11.22.33.44")
	d := newTestDialer(t, Config{
		Resolver: res,
		Local:    fakeLocal{own: true},
		Allow:    []string{"NAS.lan.", "10.0.0.0/8", "11.22.33.44", "localhost", "[fd00::5]"},
	})
	cases := []struct {
		host string
		want Reason
	}{
		{"nas.lan", Allowed},
		{"other.lan", ReasonPrivate},
		{"half.lan", ReasonPrivate}, // 10.1.2.3 is listed, 192.168.1.7 is not
		{"10.9.9.9", Allowed},
		{"11.0.0.1", Allowed},
		{"11.22.33.44", Allowed}, // this machine, but listed
		{"::ffff:10.1.1.1", Allowed},
		{"192.168.0.1", ReasonPrivate},
		{"localhost", ReasonUnknown}, // listed name: not refused by name; the resolver does not know it
		{"printer.lan", Allowed},
	}
	for _, tc := range cases {
		dec, err := d.Check(context.Background(), "tcp", tc.host)
		if tc.host == "localhost" {
			// The listed name skips the localhost-name refusal and goes to
			// the resolver, which fails here.
			if err == nil || dec.Reason == ReasonLocalhostName {
				t.Errorf("Check(localhost) = %+v, %v; want a lookup error", dec, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("Check(%q): %v", tc.host, err)
		}
		if dec.Reason != tc.want || dec.Allowed != (tc.want == Allowed) {
			t.Errorf("Check(%q) = %v %q, want %q", tc.host, dec.Allowed, dec.Reason, tc.want)
		}
	}
}

// TestParseAllowListRejectsMalformed: a typo in the allow list is an error.
func TestParseAllowListRejectsMalformed(t *testing.T) {
	for _, e := range []string{"10.0.0.0/33", "bad host", "fe80::1%eth0", "a/b", "", "host:80"} {
		if _, err := ParseAllowList([]string{e}); err == nil {
			t.Errorf("ParseAllowList(%q): no error", e)
		}
	}
}

// TestDialDialsTheCheckedAddressOnce: the name is resolved once and the
// address dialed is the address checked, even when a second lookup would
// answer differently (DNS rebinding).
func TestDialDialsTheCheckedAddressOnce(t *testing.T) {
	res := newFakeResolver(nil)
	res.add("rebind.example", "8.8.8.8")
	res.add("rebind.example", "127.0.0.1")
	var got []string
	var mu sync.Mutex
	d := newTestDialer(t, Config{Resolver: res, Dial: func(_ context.Context, _, addr string) (net.Conn, error) {
		mu.Lock()
		got = append(got, addr)
		mu.Unlock()
		c1, c2 := net.Pipe()
		_ = c2.Close()
		return c1, nil
	}})
	c, err := d.DialContext(context.Background(), "tcp", "rebind.example:443")
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if n := res.lookups("rebind.example"); n != 1 {
		t.Fatalf("looked up %d times, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, []string{"8.8.8.8:443"}) {
		t.Fatalf("dialed %v, want [8.8.8.8:443]", got)
	}
}

// TestDialRefusesLiteralsAndBadTargets: literal addresses are judged with
// no lookup; malformed targets wrap ErrBadTarget.
func TestDialRefusesLiteralsAndBadTargets(t *testing.T) {
	d := newTestDialer(t, Config{})
	for target, want := range map[string]Reason{
		"127.0.0.1:80":           ReasonLoopback,
		"[::1]:80":               ReasonLoopback,
		"[::ffff:10.0.0.1]:80":   ReasonPrivate,
		"169.254.169.254:80":     ReasonLinkLocal,
		"[fd00:ec2::254]:80":     ReasonULA,
		"100.100.100.200:80":     ReasonCGNAT,
		"[64:ff9b::7f00:1]:80":   ReasonLoopback,
		"[2002:a00:1::1]:80":     ReasonPrivate,
		"localhost:80":           ReasonLocalhostName,
		"0.0.0.0:80":             ReasonUnspecified,
		"[::]:80":                ReasonUnspecified,
		"[64:ff9b:1::1]:80":      ReasonNAT64Local,
		"[::ffff:0:8.8.8.8]:443": ReasonIPv4Translated,
	} {
		_, err := d.DialContext(context.Background(), "tcp", target)
		var re *RefusedError
		if !errors.As(err, &re) || re.Reason != want {
			t.Errorf("DialContext(%q) = %v; want RefusedError %q", target, err, want)
		}
	}
	for _, target := range []string{"example.com", "[fe80::1%eth0]:80", "exa mple.com:80", "::1:80", "a:0", ""} {
		_, err := d.DialContext(context.Background(), "tcp", target)
		if !errors.Is(err, ErrBadTarget) {
			t.Errorf("DialContext(%q) = %v; want ErrBadTarget", target, err)
		}
	}
	if _, err := d.DialContext(context.Background(), "unix", "8.8.8.8:80"); err == nil {
		t.Errorf("DialContext(unix): no error")
	}
}

// TestDialFamilyFollowsNetwork: tcp4 checks and dials only IPv4 answers.
func TestDialFamilyFollowsNetwork(t *testing.T) {
	res := newFakeResolver(map[string][]string{"dual.example": {"2001:4860::1", "8.8.8.8"}})
	var got atomic.Value
	d := newTestDialer(t, Config{Resolver: res, Dial: func(_ context.Context, _, addr string) (net.Conn, error) {
		got.Store(addr)
		c1, c2 := net.Pipe()
		_ = c2.Close()
		return c1, nil
	}})
	c, err := d.DialContext(context.Background(), "tcp4", "dual.example:80")
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if got.Load() != "8.8.8.8:80" {
		t.Fatalf("dialed %v, want 8.8.8.8:80", got.Load())
	}
}

// closeSignalConn reports when it is closed.
type closeSignalConn struct {
	net.Conn
	closed chan struct{}
	once   sync.Once
}

func (c *closeSignalConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

func pipeConn() *closeSignalConn {
	c1, c2 := net.Pipe()
	_ = c2.Close()
	return &closeSignalConn{Conn: c1, closed: make(chan struct{})}
}

// TestDialStaggersToNextAddressWhileFirstPending: when the first address
// does not answer within the stagger, the next is started while the first
// is still pending, the first to connect wins, and a loser that connects
// late is closed.
func TestDialStaggersToNextAddressWhileFirstPending(t *testing.T) {
	res := newFakeResolver(map[string][]string{"slow.example": {"1.1.1.1", "8.8.8.8"}})
	release := make(chan struct{})
	firstPending := make(chan struct{})
	var secondStartedWhileFirstPending atomic.Bool
	late := pipeConn()
	winner := pipeConn()
	d := newTestDialer(t, Config{
		Resolver: res,
		Stagger:  20 * time.Millisecond,
		Timeout:  10 * time.Second,
		Dial: func(ctx context.Context, _, addr string) (net.Conn, error) {
			switch addr {
			case "1.1.1.1:443":
				close(firstPending)
				<-release // connects only after the test says so
				return late, nil
			case "8.8.8.8:443":
				<-firstPending // the first attempt has started and is blocked
				secondStartedWhileFirstPending.Store(true)
				return winner, nil
			}
			return nil, fmt.Errorf("unexpected %s", addr)
		},
	})
	c, err := d.DialContext(context.Background(), "tcp", "slow.example:443")
	if err != nil {
		t.Fatal(err)
	}
	// Without a Stagger the dialer waits the documented 300 ms.
	if dflt := newTestDialer(t, Config{}); dflt.stagger != 300*time.Millisecond {
		t.Fatalf("default stagger %v, want 300ms", dflt.stagger)
	}
	if c != winner {
		t.Fatalf("got a connection other than the second address's")
	}
	if !secondStartedWhileFirstPending.Load() {
		t.Fatalf("second address was not dialed while the first was pending")
	}
	close(release)
	<-late.closed // the late connection is closed, not leaked
	_ = c.Close()
}

// TestDialMovesOnImmediatelyAfterFailure: a failed attempt starts the next
// one at once, without waiting for the stagger; addresses go in order.
func TestDialMovesOnImmediatelyAfterFailure(t *testing.T) {
	res := newFakeResolver(map[string][]string{"flaky.example": {"1.1.1.1", "1.0.0.1", "8.8.8.8"}})
	var mu sync.Mutex
	var order []string
	d := newTestDialer(t, Config{
		Resolver: res,
		Stagger:  time.Hour, // a test waiting for it would time out
		Timeout:  5 * time.Second,
		Dial: func(_ context.Context, _, addr string) (net.Conn, error) {
			mu.Lock()
			order = append(order, addr)
			mu.Unlock()
			if addr == "8.8.8.8:80" {
				return pipeConn(), nil
			}
			return nil, errors.New("connection refused")
		},
	})
	c, err := d.DialContext(context.Background(), "tcp", "flaky.example:80")
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"1.1.1.1:80", "1.0.0.1:80", "8.8.8.8:80"}; !slices.Equal(order, want) {
		t.Fatalf("dial order %v, want %v", order, want)
	}
}

// TestDialAllFailReturnsEveryError.
func TestDialAllFailReturnsEveryError(t *testing.T) {
	res := newFakeResolver(map[string][]string{"down.example": {"1.1.1.1", "8.8.8.8"}})
	d := newTestDialer(t, Config{Resolver: res, Stagger: time.Hour, Timeout: 5 * time.Second,
		Dial: func(_ context.Context, _, addr string) (net.Conn, error) {
			return nil, fmt.Errorf("refused by %s", addr)
		}})
	_, err := d.DialContext(context.Background(), "tcp", "down.example:80")
	if err == nil || !strings.Contains(err.Error(), "refused by 1.1.1.1:80") || !strings.Contains(err.Error(), "refused by 8.8.8.8:80") {
		t.Fatalf("error %v does not name both failures", err)
	}
	var re *RefusedError
	if errors.As(err, &re) {
		t.Fatalf("a dial failure must not look like a refusal")
	}
}

// TestHTTPClientRefusalIsErrorsAs: a refused dial through http.Client is
// still a *RefusedError under errors.As.
func TestHTTPClientRefusalIsErrorsAs(t *testing.T) {
	res := newFakeResolver(map[string][]string{"internal.example": {"10.0.0.1"}})
	c := NewHTTPClient(newTestDialer(t, Config{Resolver: res}))
	_, err := c.Get("http://internal.example/")
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != ReasonPrivate {
		t.Fatalf("Get error %v; want *RefusedError private", err)
	}
}

// TestHTTPClientChecksRedirects: CheckRedirect resolves and judges the
// redirect target itself, and refuses it.
func TestHTTPClientChecksRedirects(t *testing.T) {
	res := newFakeResolver(map[string][]string{"metadata.example": {"169.254.169.254"}, "ok.example": {"8.8.8.8"}})
	c := NewHTTPClient(newTestDialer(t, Config{Resolver: res}))
	req := httptest.NewRequest(http.MethodGet, "http://metadata.example/latest/", nil)
	err := c.CheckRedirect(req, []*http.Request{httptest.NewRequest(http.MethodGet, "http://ok.example/", nil)})
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != ReasonLinkLocal {
		t.Fatalf("CheckRedirect = %v; want *RefusedError link-local", err)
	}
	if n := res.lookups("metadata.example"); n != 1 {
		t.Fatalf("CheckRedirect looked the target up %d times, want 1", n)
	}
	ok := httptest.NewRequest(http.MethodGet, "http://ok.example/", nil)
	if err := c.CheckRedirect(ok, nil); err != nil {
		t.Fatalf("CheckRedirect(public) = %v", err)
	}
	ftp := httptest.NewRequest(http.MethodGet, "http://ok.example/", nil)
	ftp.URL.Scheme = "ftp"
	if err := c.CheckRedirect(ftp, nil); !errors.Is(err, ErrBadTarget) {
		t.Fatalf("CheckRedirect(ftp) = %v; want ErrBadTarget", err)
	}
}

// TestHTTPClientFollowsRedirectEndToEnd: a real server on loopback (allowed
// for this test only) redirects to a private name; the client stops there
// with a refusal and never dials it.
func TestHTTPClientFollowsRedirectEndToEnd(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://internal.example/admin", http.StatusFound)
	}))
	defer srv.Close()
	res := newFakeResolver(map[string][]string{"internal.example": {"192.168.1.1"}})
	d, err := NewDialer(Config{Resolver: res, Local: fakeLocal{}, Allow: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewHTTPClient(d).Get(srv.URL)
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != ReasonPrivate || re.Target != "internal.example" {
		t.Fatalf("Get = %v; want redirect refused as private", err)
	}
}

// TestHTTPClientCapsRedirects: at most MaxRedirects redirects are followed.
func TestHTTPClientCapsRedirects(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Redirect(w, r, "/again", http.StatusFound)
	}))
	defer srv.Close()
	d, err := NewDialer(Config{Resolver: newFakeResolver(nil), Local: fakeLocal{}, Allow: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewHTTPClient(d).Get(srv.URL)
	if !errors.Is(err, ErrTooManyRedirects) {
		t.Fatalf("Get = %v; want ErrTooManyRedirects", err)
	}
	// The first request and 5 redirects followed: the sixth redirect is
	// refused (the number is the documented one, not MaxRedirects).
	if n := hits.Load(); n != 6 {
		t.Fatalf("server saw %d requests, want 6 (5 redirects followed)", n)
	}
}
