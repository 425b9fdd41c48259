package egresslane

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// serveCP runs a Dispatcher on a loopback listener with who; it returns
// the Dispatcher and the listener's address.
func serveCP(t *testing.T, clk clock.Clock, who func(net.Addr) (string, bool)) (*Dispatcher, string) {
	t.Helper()
	d := NewDispatcher(clk, nil)
	return d, serveOn(t, d, who)
}

// serveOn serves d on a new loopback listener with who and returns its
// address.
func serveOn(t *testing.T, d *Dispatcher, who func(net.Addr) (string, bool)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := d.Serve(ctx, ln, who); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return ln.Addr().String()
}

// rawWorker connects to addr and sends hello (when not empty).
func rawWorker(t *testing.T, addr, hello string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(testWait))
	if hello != "" {
		if _, err := io.WriteString(c, hello); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// wantClosed checks the CP closed c: a read ends with EOF (or a reset),
// not the test's deadline.
func wantClosed(t *testing.T, c net.Conn) {
	t.Helper()
	var b [1]byte
	_, err := c.Read(b[:])
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open: read %v", err)
	}
}

func constWho(id string, ok bool) func(net.Addr) (string, bool) {
	return func(net.Addr) (string, bool) { return id, ok }
}

// TestUnknownPeerClosed closes a connection who does not know.
func TestUnknownPeerClosed(t *testing.T) {
	d, addr := serveCP(t, clock.Real{}, constWho("", false))
	c := rawWorker(t, addr, "{\"v\":1}\n")
	wantClosed(t, c)
	if n := d.Parked(""); n != 0 {
		t.Fatalf("parked %d", n)
	}
}

// TestBadHelloClosed closes a worker whose hello is not exactly {"v":1}.
func TestBadHelloClosed(t *testing.T) {
	d, addr := serveCP(t, clock.Real{}, constWho("b1", true))
	for _, h := range []string{"{\"v\":2}\n", "{\"v\":1,\"x\":1}\n", "hello\n", strings.Repeat("a", MaxLine)} {
		c := rawWorker(t, addr, h)
		wantClosed(t, c)
	}
	if n := d.Parked("b1"); n != 0 {
		t.Fatalf("parked %d", n)
	}
}

// TestHelloTimeout closes a connection that says nothing for HelloTimeout
// on the Dispatcher's clock.
func TestHelloTimeout(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	_, addr := serveCP(t, clk, constWho("b1", true))
	c := rawWorker(t, addr, "")
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	if err := clk.BlockUntil(ctx, 1); err != nil {
		t.Fatalf("no hello timer: %v", err)
	}
	clk.Advance(HelloTimeout)
	wantClosed(t, c)
}

// TestDropClosesParked closes every parked worker of the dropped bastion
// and no other bastion's.
func TestDropClosesParked(t *testing.T) {
	d1, addr1 := serveCP(t, clock.Real{}, constWho("b1", true))
	a := rawWorker(t, addr1, "{\"v\":1}\n")
	b := rawWorker(t, addr1, "{\"v\":1}\n")
	waitFor(t, func() bool { return d1.Parked("b1") == 2 }, "two parked")
	d1.Drop("b1")
	wantClosed(t, a)
	wantClosed(t, b)
	if n := d1.Parked("b1"); n != 0 {
		t.Fatalf("parked %d after Drop", n)
	}
}

// TestDropOnlyThatBastion keeps another bastion's workers parked.
func TestDropOnlyThatBastion(t *testing.T) {
	d := NewDispatcher(clock.Real{}, nil)
	c1 := rawWorker(t, serveOn(t, d, constWho("b1", true)), "{\"v\":1}\n")
	rawWorker(t, serveOn(t, d, constWho("b2", true)), "{\"v\":1}\n")
	waitFor(t, func() bool { return d.Parked("b1") == 1 && d.Parked("b2") == 1 }, "both parked")
	d.Drop("b1")
	wantClosed(t, c1)
	if d.Parked("b2") != 1 {
		t.Fatal("Drop(b1) closed b2's worker")
	}
}

// TestDialNoWorker fails with ErrNoWorker once the caller's context ends.
func TestDialNoWorker(t *testing.T) {
	d := NewDispatcher(clock.Real{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := d.Dial(ctx, "b1", "example.com:443")
	if !errors.Is(err, ErrNoWorker) || !strings.Contains(err.Error(), "no egress worker parked") {
		t.Fatalf("got %v, want ErrNoWorker", err)
	}
}

// TestDialBadTarget refuses a malformed target before a worker is used.
func TestDialBadTarget(t *testing.T) {
	d, addr := serveCP(t, clock.Real{}, constWho("b1", true))
	rawWorker(t, addr, "{\"v\":1}\n")
	waitFor(t, func() bool { return d.Parked("b1") == 1 }, "parked")
	_, err := d.Dial(context.Background(), "b1", "example.com")
	if !errors.Is(err, ErrMalformed) {
		t.Fatalf("got %v, want ErrMalformed", err)
	}
	if d.Parked("b1") != 1 {
		t.Fatal("a bad target used a worker")
	}
}

// TestHungUpWorkerLeaves removes a parked worker that hangs up, so Dial
// never hands a job to a dead connection.
func TestHungUpWorkerLeaves(t *testing.T) {
	d, addr := serveCP(t, clock.Real{}, constWho("b1", true))
	c := rawWorker(t, addr, "{\"v\":1}\n")
	waitFor(t, func() bool { return d.Parked("b1") == 1 }, "parked")
	_ = c.Close()
	waitFor(t, func() bool { return d.Parked("b1") == 0 }, "the hung-up worker to leave")
}

// TestMaxParked closes a bastion's worker beyond MaxParked.
func TestMaxParked(t *testing.T) {
	d, addr := serveCP(t, clock.Real{}, constWho("b1", true))
	for range MaxParked {
		rawWorker(t, addr, "{\"v\":1}\n")
	}
	waitFor(t, func() bool { return d.Parked("b1") == MaxParked }, "MaxParked parked")
	c := rawWorker(t, addr, "{\"v\":1}\n")
	wantClosed(t, c)
	if n := d.Parked("b1"); n != MaxParked {
		t.Fatalf("parked %d", n)
	}
}

// TestRogueVerdict does not pass on a verdict that is not well-formed (a
// reason a bastion could use to inject text into the CP's errors).
func TestRogueVerdict(t *testing.T) {
	for _, v := range []string{
		`{"ok":false,"reason":"Evil Reason"}`,
		`{"ok":false}`,
		`{"ok":true,"reason":"x"}`,
		`{"ok":"true"}`,
		`{"ok":false,"reason":"` + strings.Repeat("a", 65) + `"}`,
	} {
		d, addr := serveCP(t, clock.Real{}, constWho("b1", true))
		c := rawWorker(t, addr, "{\"v\":1}\n")
		waitFor(t, func() bool { return d.Parked("b1") == 1 }, "parked")
		go func() {
			r := bufio.NewReader(c)
			if _, err := r.ReadString('\n'); err == nil {
				_, _ = io.WriteString(c, v+"\n")
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		_, err := d.Dial(ctx, "b1", "example.com:443")
		cancel()
		var re *RefusedError
		if !errors.Is(err, ErrMalformed) || errors.As(err, &re) {
			t.Fatalf("verdict %s: got %v, want ErrMalformed", v, err)
		}
	}
}
