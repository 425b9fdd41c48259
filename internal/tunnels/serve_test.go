package tunnels

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/tunnelwire"
)

// pipeNode is a working in-memory node stream: what the client sends
// is echoed back; Close ends it.
type pipeNode struct {
	data   chan []byte
	done   chan struct{}
	once   sync.Once
	reason string
}

func newPipeNode() *pipeNode {
	return &pipeNode{data: make(chan []byte, 16), done: make(chan struct{})}
}

func (p *pipeNode) Recv() (Chunk, error) {
	select {
	case d := <-p.data:
		return Chunk{Data: d}, nil
	case <-p.done:
		return Chunk{}, errors.New("closed")
	}
}
func (p *pipeNode) Resize(cols, rows uint16) error { return nil }
func (p *pipeNode) Send(d []byte) error {
	select {
	case p.data <- append([]byte(nil), d...):
		return nil
	case <-p.done:
		return errors.New("closed")
	}
}
func (p *pipeNode) CloseSend() error { return nil }
func (p *pipeNode) Close(reason string) {
	p.once.Do(func() { p.reason = reason; close(p.done) })
}
func (p *pipeNode) Done() <-chan struct{} { return p.done }

// syncBuffer is a bytes.Buffer safe for the writer goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) frames(t *testing.T) []tunnelwire.Frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []tunnelwire.Frame
	r := tunnelwire.NewReader(bytes.NewReader(s.b.Bytes()))
	for {
		f, err := r.Next()
		if err != nil {
			return out
		}
		f.Payload = append([]byte(nil), f.Payload...)
		out = append(out, f)
	}
}

// serveWith serves a tunnel over a pipe node with clk and recheck until
// the test drives it to its end; it returns the service, the tunnel, the
// client's frames and Serve's result channel.
func serveWith(t *testing.T, clk *clock.Fake, recheck Recheck) (*pipeNode, *syncBuffer, <-chan error) {
	t.Helper()
	s := New(Deps{DB: storetest.NewTestSQLite(t), Clock: clk})
	node := newPipeNode()
	tun := &Tunnel{node: node, actor: audit.Entry{TenantID: "root", Actor: "alice"}, jti: "j1", nodeID: "n1", port: 22, opened: clk.Now(), closed: make(chan struct{})}
	clientR, clientW := io.Pipe()
	t.Cleanup(func() { clientW.Close() })
	out := &syncBuffer{}
	res := make(chan error, 1)
	go func() { res <- s.Serve(context.Background(), tun, clientR, out, func() { clientW.Close() }, recheck) }()
	// The ticker and the lifetime timer wait on the clock.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.BlockUntil(ctx, 2); err != nil {
		t.Fatal(err)
	}
	return node, out, res
}

// lastRefusal is the code of the client's last frame, an error frame.
func lastRefusal(t *testing.T, out *syncBuffer) string {
	t.Helper()
	fs := out.frames(t)
	if len(fs) == 0 || fs[len(fs)-1].Type != tunnelwire.Error {
		t.Fatalf("no error frame last: %v", fs)
	}
	ref, _ := tunnelwire.DecodeRefusal(fs[len(fs)-1].Payload)
	return ref.Code
}

// stepper advances clk and waits for the watch loop's recheck of that
// tick, failing when the tunnel ended instead. A tunnel that ends right
// after its tick's recheck (the recheck decided to close it) keeps its
// result in stash for end: both are ready then, and select would pick
// either.
type stepper struct {
	t     *testing.T
	clk   *clock.Fake
	calls chan struct{}
	res   <-chan error
	stash chan error
}

// newStepper is a stepper over clk, calls and res.
func newStepper(t *testing.T, clk *clock.Fake, calls chan struct{}, res <-chan error) stepper {
	return stepper{t, clk, calls, res, make(chan error, 1)}
}

func (s stepper) tick(d time.Duration, what string) {
	s.t.Helper()
	select {
	case err := <-s.stash:
		s.t.Fatalf("%s: the tunnel had ended: %v", what, err)
	default:
	}
	s.clk.Advance(d)
	select {
	case <-s.calls:
	case err := <-s.res:
		select {
		case <-s.calls: // this tick's recheck ran, then ended the tunnel
			s.stash <- err
		default:
			s.t.Fatalf("%s: the tunnel ended: %v", what, err)
		}
	}
}

// end waits for Serve's result; a tunnel that does not end fails the
// test after 10 s instead of hanging it.
func (s stepper) end() error {
	s.t.Helper()
	select {
	case err := <-s.stash:
		return err
	default:
	}
	select {
	case err := <-s.res:
		return err
	case <-time.After(10 * time.Second):
		s.t.Fatal("the tunnel did not end")
		return nil
	}
}

// recorder is a Recheck answering ok, err and telling calls.
func recorder(calls chan struct{}, ok bool, err error) Recheck {
	return func(context.Context) (bool, error) {
		calls <- struct{}{}
		return ok, err
	}
}

// TestServeClosesAfterTwoMinutesUndecided: rechecks that fail (IAM
// unreachable) keep the tunnel open through every tick before FailFor
// has passed since the last decision (each tick's recheck happens, which
// it would not on a closed tunnel), then close it UNAVAILABLE at the tick
// that reaches FailFor.
func TestServeClosesAfterTwoMinutesUndecided(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	calls := make(chan struct{}, 1000)
	node, out, res := serveWith(t, clk, recorder(calls, false, errors.New("iam unreachable")))
	s := newStepper(t, clk, calls, res)
	for i := 1; i < int(FailFor/RecheckEvery); i++ {
		s.tick(RecheckEvery, "undecided tick "+strconv.Itoa(i))
	}
	// The tick that reaches FailFor closes the tunnel (whether its
	// recheck runs first or not).
	clk.Advance(RecheckEvery)
	if err := s.end(); err != errUndecided {
		t.Fatalf("end: %v", err)
	}
	if lastRefusal(t, out) != string(errs.Unavailable) || node.reason != string(errs.Unavailable) {
		t.Fatalf("client frame %q, node told %q", lastRefusal(t, out), node.reason)
	}
}

// TestServeClosesAtOnceOnRefusal: a recheck that refuses closes the
// tunnel at that tick, ACCESS_DENIED.
func TestServeClosesAtOnceOnRefusal(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	calls := make(chan struct{}, 1000)
	_, out, res := serveWith(t, clk, recorder(calls, false, nil))
	s := newStepper(t, clk, calls, res)
	s.tick(RecheckEvery, "first recheck")
	if err := s.end(); err != errRevoked {
		t.Fatalf("end: %v", err)
	}
	if lastRefusal(t, out) != string(errs.AccessDenied) {
		t.Fatal("client not told ACCESS_DENIED")
	}
}

// TestServeClosesAfterTwelveHours: a tunnel whose caller stays allowed
// is still open (rechecked) 2 s before MaxLife and closed at MaxLife.
func TestServeClosesAfterTwelveHours(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	calls := make(chan struct{}, 1000)
	_, out, res := serveWith(t, clk, recorder(calls, true, nil))
	s := newStepper(t, clk, calls, res)
	s.tick(MaxLife-3*time.Second, "11:59:57")
	s.tick(time.Second, "11:59:58")
	clk.Advance(2 * time.Second)
	if err := s.end(); err != errLifetime {
		t.Fatalf("end: %v", err)
	}
	if lastRefusal(t, out) != string(errs.InvalidState) {
		t.Fatal("client not told the limit")
	}
}
