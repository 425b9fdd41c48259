package egresslane

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/netguard"
)

// testWait bounds every wait in these tests.
const testWait = 10 * time.Second

// fakeResolver answers names from a table, so no DNS is needed.
type fakeResolver map[string][]netip.Addr

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// localSet is a LocalChecker that takes the listed addresses as this
// machine's (a public address on an interface, without needing one).
type localSet []netip.Addr

func (s localSet) IsLocal(_ context.Context, a netip.Addr) (bool, string, error) {
	for _, x := range s {
		if x == a {
			return true, "test interface", nil
		}
	}
	return false, "", nil
}

func newGuard(t *testing.T, cfg netguard.Config) *netguard.Dialer {
	t.Helper()
	g, err := netguard.NewDialer(cfg)
	if err != nil {
		t.Fatalf("netguard.NewDialer: %v", err)
	}
	return g
}

// echoServer serves an echo on loopback and counts the connections it
// accepted.
type echoServer struct {
	addr string
	mu   sync.Mutex
	n    int
}

func (e *echoServer) accepted() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.n++
			e.mu.Unlock()
			wg.Go(func() {
				_, _ = io.Copy(c, c)
				_ = c.Close()
			})
		}
	})
	return e
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// lane is a Dispatcher on a loopback listener with RunWorkers parked on it;
// the workers' clock is fake, the Dispatcher's real.
type lane struct {
	t   *testing.T
	d   *Dispatcher
	clk *clock.Fake

	mu     sync.Mutex
	events []Event
}

func loopbackWho(a net.Addr) (string, bool) {
	ta, ok := a.(*net.TCPAddr)
	if !ok || !ta.IP.IsLoopback() {
		return "", false
	}
	return "b1", true
}

// startLane starts both sides; cfg's Dial, Clock and Audit are filled in.
func startLane(t *testing.T, cfg WorkerConfig) *lane {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := NewDispatcher(clock.Real{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := d.Serve(ctx, ln, loopbackWho); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	l := startWorkers(t, cfg, ln.Addr().String())
	l.d = d
	return l
}

// startWorkers runs RunWorkers against addr with a fake clock; cfg's
// Dial, Clock and Audit are filled in.
func startWorkers(t *testing.T, cfg WorkerConfig, addr string) *lane {
	t.Helper()
	l := &lane{t: t, clk: clock.NewFake(time.Unix(1_000_000, 0))}
	ctx, cancel := context.WithCancel(context.Background())
	var nd net.Dialer
	cfg.Dial = func(ctx context.Context) (net.Conn, error) { return nd.DialContext(ctx, "tcp", addr) }
	cfg.Clock = l.clk
	cfg.Audit = func(e Event) { l.mu.Lock(); l.events = append(l.events, e); l.mu.Unlock() }
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := RunWorkers(ctx, cfg); err != nil {
			t.Errorf("RunWorkers: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// lastEvent returns the latest audit event.
func (l *lane) lastEvent() Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.events) == 0 {
		l.t.Fatal("no audit event")
	}
	return l.events[len(l.events)-1]
}

// waitParked polls until n workers of b1 are parked.
func (l *lane) waitParked(n int) {
	l.t.Helper()
	waitFor(l.t, func() bool { return l.d.Parked("b1") == n }, "parked workers")
}

// backoff waits until a worker waits on the clock, then lets it go.
func (l *lane) backoff() {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	if err := l.clk.BlockUntil(ctx, 1); err != nil {
		l.t.Fatalf("no worker waits its backoff: %v", err)
	}
	l.clk.Advance(DefaultBackoff)
}

// dial asks the lane for target with a bounded context.
func (l *lane) dial(target string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	return l.d.Dial(ctx, "b1", target)
}

// wantRefused checks err is the bastion's refusal with reason.
func wantRefused(t *testing.T, err error, reason string) {
	t.Helper()
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("got %v, want a refusal %q", err, reason)
	}
	if re.Reason != reason {
		t.Fatalf("refused %q, want %q", re.Reason, reason)
	}
}

// waitFor polls cond until it holds or testWait passes.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}
