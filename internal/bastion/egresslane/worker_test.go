package egresslane

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/netguard"
)

// TestRefusesNonPublicTargets runs every job through a production-shaped
// guard (no Allow exceptions) and checks the bastion's exact reason.
func TestRefusesNonPublicTargets(t *testing.T) {
	echo := startEcho(t)
	res := fakeResolver{
		"internal.example": {netip.MustParseAddr("10.1.2.3")},
		"mixed.example":    {netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("10.1.2.3")},
	}
	l := startLane(t, WorkerConfig{
		Enabled: true,
		Guard:   newGuard(t, netguard.Config{Resolver: res}),
		Allowed: func() bool { return true },
		Workers: 1,
	})
	cases := []struct{ target, reason string }{
		{echo.addr, "loopback"},
		{"10.0.0.1:80", "private"},
		{"192.168.1.1:80", "private"},
		{"169.254.169.254:80", "link-local"},
		{"[::1]:80", "loopback"},
		{"[::ffff:10.0.0.1]:80", "private"},
		{"[::ffff:127.0.0.1]:80", "loopback"},
		{"0.0.0.0:80", "unspecified"},
		{"internal.example:443", "private"},
		{"mixed.example:443", "private"},
		{"localhost:80", "localhost-name"},
	}
	for _, c := range cases {
		_, err := l.dial(c.target)
		wantRefused(t, err, c.reason)
		// The event reaches the CP: it names the target the CP sent,
		// never what the name resolved to on the owner's network.
		if e := l.lastEvent(); e.Kind != KindRefuse || e.Lane != Lane || e.Reason != c.reason || e.Detail != c.target {
			t.Fatalf("%s: audit %+v, want a refuse event with reason %q and the target alone as detail", c.target, e, c.reason)
		}
		l.backoff()
	}
	if n := echo.accepted(); n != 0 {
		t.Fatalf("the loopback echo server was reached %d times", n)
	}
}

// TestRefusesThisMachine refuses addresses on this machine's interfaces
// (with the real LocalChecker) and a public address this machine holds.
func TestRefusesThisMachine(t *testing.T) {
	public := netip.MustParseAddr("93.184.215.14")
	l := startLane(t, WorkerConfig{
		Enabled: true,
		Guard:   newGuard(t, netguard.Config{Local: localSet{public}}),
		Allowed: func() bool { return true },
		Workers: 1,
	})
	_, err := l.dial("93.184.215.14:443")
	wantRefused(t, err, "this-machine")
	l.backoff()

	real := startLane(t, WorkerConfig{
		Enabled: true,
		Guard:   newGuard(t, netguard.Config{}),
		Allowed: func() bool { return true },
		Workers: 1,
	})
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	tried := 0
	for _, ia := range addrs {
		p, err := netip.ParsePrefix(ia.String())
		if err != nil || p.Addr().IsLoopback() || p.Addr().Zone() != "" {
			continue
		}
		a := p.Addr()
		want := string(netguard.Classify(a))
		if want == "" {
			want = "this-machine" // a public address on an interface
		}
		_, err = real.dial(netip.AddrPortFrom(a, 80).String())
		wantRefused(t, err, want)
		real.backoff()
		tried++
	}
	t.Logf("checked %d interface addresses", tried)
}

// TestNotGranted refuses every job while the grants lack egress, read per
// job: the same workers serve once the grant holds.
func TestNotGranted(t *testing.T) {
	echo := startEcho(t)
	var granted atomic.Bool
	l := startLane(t, WorkerConfig{
		Enabled: true,
		Guard:   newGuard(t, netguard.Config{Allow: []string{"127.0.0.1"}}),
		Allowed: granted.Load,
		Workers: 1,
	})
	_, err := l.dial(echo.addr)
	wantRefused(t, err, ReasonNotGranted)
	if n := echo.accepted(); n != 0 {
		t.Fatalf("target reached %d times without the grant", n)
	}
	l.backoff()
	granted.Store(true)
	c, err := l.dial(echo.addr)
	if err != nil {
		t.Fatalf("with the grant: %v", err)
	}
	_ = c.Close()
}

// TestNotEnabled: without the owner's consent on the machine (Enabled
// false) every job is refused egress-not-enabled, also with the grant, and
// nothing is dialled.
func TestNotEnabled(t *testing.T) {
	echo := startEcho(t)
	l := startLane(t, WorkerConfig{
		Guard:   newGuard(t, netguard.Config{Allow: []string{"127.0.0.1"}}),
		Allowed: func() bool { return true },
		Workers: 1,
	})
	_, err := l.dial(echo.addr)
	wantRefused(t, err, ReasonNotEnabled)
	if e := l.lastEvent(); e.Kind != KindRefuse || e.Reason != ReasonNotEnabled {
		t.Fatalf("audit %+v, want a refuse event %s", e, ReasonNotEnabled)
	}
	if n := echo.accepted(); n != 0 {
		t.Fatalf("target reached %d times without the owner's consent", n)
	}
}

// TestRefusalBacksOff checks a refused worker parks again only after
// Backoff on the clock, and not a moment before.
func TestRefusalBacksOff(t *testing.T) {
	l := startLane(t, WorkerConfig{
		Enabled: true,
		Guard:   newGuard(t, netguard.Config{}),
		Allowed: func() bool { return false },
		Workers: 1,
	})
	l.waitParked(1)
	_, err := l.dial("93.184.215.14:443")
	wantRefused(t, err, ReasonNotGranted)
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	if err := l.clk.BlockUntil(ctx, 1); err != nil {
		t.Fatalf("the refused worker does not wait on the clock: %v", err)
	}
	if n := l.d.Parked("b1"); n != 0 {
		t.Fatalf("parked %d during the backoff", n)
	}
	l.clk.Advance(DefaultBackoff - time.Millisecond)
	if n, w := l.d.Parked("b1"), l.clk.Waiters(); n != 0 || w != 1 {
		t.Fatalf("after 999ms: parked %d, clock waiters %d; want 0 and 1", n, w)
	}
	l.clk.Advance(time.Millisecond)
	l.waitParked(1)
}

// TestSuccessSplicesAndReparks reaches a loopback echo server through a
// guard with a test-only Allow exception; bytes flow both ways, a
// half-close passes through, and both workers park again at once (the
// fake clock never moves).
func TestSuccessSplicesAndReparks(t *testing.T) {
	echo := startEcho(t)
	l := startLane(t, WorkerConfig{
		Enabled: true,
		Guard:   newGuard(t, netguard.Config{Allow: []string{"127.0.0.1"}}),
		Allowed: func() bool { return true },
	})
	l.waitParked(DefaultWorkers)
	c, err := l.dial(echo.addr)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	l.waitParked(DefaultWorkers)
	if _, err := io.WriteString(c, "ping egress\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(testWait))
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != "ping egress\n" {
		t.Fatalf("echo: %q, %v", got, err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(c); err != nil || len(rest) != 0 {
		t.Fatalf("after half-close: %q, %v; want a clean end", rest, err)
	}
	if e := l.lastEvent(); e.Kind != KindAccept || e.Lane != Lane || e.Detail != echo.addr || e.Reason != "" {
		t.Fatalf("audit %+v, want an accept of %s", e, echo.addr)
	}
}

// TestDialFailed refuses a target that does not answer with dial-failed.
func TestDialFailed(t *testing.T) {
	l := startLane(t, WorkerConfig{
		Enabled: true,
		Guard:   newGuard(t, netguard.Config{Allow: []string{"127.0.0.1"}}),
		Allowed: func() bool { return true },
		Workers: 1,
	})
	_, err := l.dial(closedPort(t))
	wantRefused(t, err, ReasonDialFailed)
	l.backoff()
	_, err = l.dial("unknown.example:443")
	wantRefused(t, err, ReasonDialFailed)
}

// TestMaxActive refuses the 17th live connection as busy.
func TestMaxActive(t *testing.T) {
	echo := startEcho(t)
	l := startLane(t, WorkerConfig{
		Enabled: true,
		Guard:   newGuard(t, netguard.Config{Allow: []string{"127.0.0.1"}}),
		Allowed: func() bool { return true },
	})
	for i := range DefaultMaxActive {
		c, err := l.dial(echo.addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
		defer c.Close()
	}
	waitFor(t, func() bool { return echo.accepted() == DefaultMaxActive }, "the target to accept every connection")
	_, err := l.dial(echo.addr)
	wantRefused(t, err, ReasonBusy)
	if n := echo.accepted(); n != DefaultMaxActive {
		t.Fatalf("target reached %d times, want %d", n, DefaultMaxActive)
	}
}

// rawCP is a listener the test drives by hand as a misbehaving CP; accept
// returns the next worker's connection.
func rawCP(t *testing.T) (addr string, accept func() net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	accept = func() net.Conn {
		t.Helper()
		_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(testWait))
		c, err := ln.Accept()
		if err != nil {
			t.Fatalf("no worker connected: %v", err)
		}
		_ = c.SetDeadline(time.Now().Add(testWait))
		return c
	}
	return ln.Addr().String(), accept
}

// TestMalformedJob sends bad job lines from a hand-driven CP: each is
// refused malformed-job, and the worker reconnects only after Backoff.
func TestMalformedJob(t *testing.T) {
	echo := startEcho(t)
	bad := []string{
		"not json",
		`{"v":1}`,
		`{"target":"` + echo.addr + `"}`,
		`{"v":2,"target":"example.com:80"}`,
		`{"v":1.0,"target":"example.com:80"}`,
		`{"v":"1","target":"example.com:80"}`,
		`{"V":1,"target":"example.com:80"}`,
		`{"v":1,"Target":"example.com:80"}`,
		`{"v":1,"target":"example.com:80","x":1}`,
		`{"v":1,"target":"example.com:80","via":"10.0.0.1:80"}`,
		`{"v":1,"target":"example.com:80","Target":"10.0.0.1:80"}`,
		`{"v":1,"target":"example.com:80","target":"example.org:80"}`,
		`{"v":1,"target":"example.com:80"} {}`,
		`{"v":1,"target":null}`,
		`{"v":1,"target":"example.com"}`,
		`{"v":1,"target":"example.com:0"}`,
		`{"v":1,"target":"example.com:65536"}`,
		`{"v":1,"target":"example.com:080"}`,
		`{"v":1,"target":"::1:80"}`,
		`{"v":1,"target":"[fe80::1%eth0]:80"}`,
		`{"v":1,"target":"[10.0.0.1]:80"}`,
		`{"v":1,"target":"exa mple.com:80"}`,
		`{"v":1,"target":"http://example.com:80"}`,
		`[{"v":1,"target":"example.com:80"}]`,
		strings.Repeat("a", MaxLine),
	}
	addr, accept := rawCP(t)
	l := startWorkers(t, WorkerConfig{
		Enabled: true,
		Guard:   newGuard(t, netguard.Config{Allow: []string{"127.0.0.1"}}),
		Allowed: func() bool { return true },
		Workers: 1,
	}, addr)
	for _, line := range bad {
		c := accept()
		r := bufio.NewReader(c)
		if h, err := r.ReadString('\n'); err != nil || h != "{\"v\":1}\n" {
			t.Fatalf("hello %q, %v", h, err)
		}
		if len(line) < MaxLine {
			line += "\n" // an overlong line is refused at MaxLine bytes
		}
		if _, err := io.WriteString(c, line); err != nil {
			t.Fatal(err)
		}
		v, err := r.ReadString('\n')
		if err != nil || v != `{"ok":false,"reason":"malformed-job"}`+"\n" {
			t.Fatalf("job %.40q: verdict %q, %v", line, v, err)
		}
		_ = c.Close()
		l.backoff()
	}
	if n := echo.accepted(); n != 0 {
		t.Fatalf("a malformed job reached the target %d times", n)
	}
}

// TestUnreachableCPBacksOff waits Backoff after a failed Dial of the CP
// rather than dialling it in a loop.
func TestUnreachableCPBacksOff(t *testing.T) {
	l := startWorkers(t, WorkerConfig{
		Enabled: true,
		Guard:   newGuard(t, netguard.Config{}),
		Allowed: func() bool { return true },
		Workers: 1,
	}, closedPort(t))
	for range 3 {
		l.backoff()
	}
}
