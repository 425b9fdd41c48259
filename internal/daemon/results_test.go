package daemon_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// This file runs the real bcd agent against a real control plane (api,
// gateway, workers on SQLite and PostgreSQL) to check that a node's
// results reach the control plane during a session: a result whose ack
// never came is sent again on the node's clock, a result the previous
// session's worker finishes goes out on the live session, and the
// reconnect back-off restarts from its minimum after a successful Hello.

var operator = audit.Entry{TenantID: "root", Actor: "test"}

// switchProxy sits between a node and the gateway at the TCP level. In
// forward mode it relays each connection to the gateway; in drop mode it
// accepts a connection and closes it at once (a gateway that accepts and
// drops before any Hello). cut closes every relayed connection (the
// gateway restarting, as the node sees it).
type switchProxy struct {
	lis     net.Listener
	target  string
	forward atomic.Bool

	mu    sync.Mutex
	conns map[net.Conn]bool
}

func startSwitchProxy(t *testing.T, target string, forward bool) *switchProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{lis: lis, target: target, conns: map[net.Conn]bool{}}
	p.forward.Store(forward)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		lis.Close()
		p.cut()
		wg.Wait()
	})
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			if !p.forward.Load() {
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = true, true
			p.mu.Unlock()
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				dst.Close()
				src.Close()
			}
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	return p
}

func (p *switchProxy) addr() string { return p.lis.Addr().String() }

// cut closes every connection relayed so far.
func (p *switchProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// gatedDriver is the sim driver, except that diag.run tells started when
// it begins and returns only once release is closed, whatever its context
// says (a command that finishes its work although the session that
// delivered it ended).
type gatedDriver struct {
	*driver.Sim
	started chan string
	release chan struct{}
}

func (g *gatedDriver) Run(ctx context.Context, kind string, payload []byte) ([]byte, error) {
	if kind == kinds.DiagRun {
		g.started <- kind
		<-g.release
	}
	return g.Sim.Run(ctx, kind, payload)
}

// agent is a bcd node agent opened on a joined node's data directory with
// the test's clock and driver, and the sessions it has had.
type agent struct {
	*daemon.Node
	states   chan bool
	sessions atomic.Int64
}

// openAgent opens the node in dir against gateway on clk with drv; the
// back-off bounds are 1 s and 1 min (of whatever clock paces them).
func openAgent(t *testing.T, dir, gateway string, clk clock.Clock, drv driver.Driver) *agent {
	t.Helper()
	n, err := daemon.Open(daemon.Config{DataDir: dir, Gateway: gateway, Driver: drv, Clock: clk, Log: testenv.Logger(t),
		MinBackoff: time.Second, MaxBackoff: time.Minute, RunningAfter: -1})
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{Node: n, states: make(chan bool, 64)}
	n.OnState(func(up bool) {
		if up {
			a.sessions.Add(1)
		}
		a.states <- up
	})
	return a
}

// run runs the agent until the test ends.
func (a *agent) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		a.Close()
	})
}

// waitState waits for the session to go up (true) or down (false).
func (a *agent) waitState(t *testing.T, up bool) {
	t.Helper()
	timeout := time.After(testenv.WaitTimeout)
	for {
		select {
		case s := <-a.states:
			if s == up {
				return
			}
		case <-timeout:
			t.Fatalf("session up=%v not reached within %v", up, testenv.WaitTimeout)
		}
	}
}

// blockUntil waits until n timers wait on clk.
func blockUntil(t *testing.T, clk *clock.Fake, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.WaitTimeout)
	defer cancel()
	if err := clk.BlockUntil(ctx, n); err != nil {
		t.Fatalf("%d timers did not start within %v (%d wait)", n, testenv.WaitTimeout, clk.Waiters())
	}
}

// lineWatch is a log writer that signals each line containing match.
type lineWatch struct {
	match []byte
	hits  chan struct{}
}

func (w *lineWatch) Write(p []byte) (int, error) {
	if bytes.Contains(p, w.match) {
		select {
		case w.hits <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

func (w *lineWatch) wait(t *testing.T) {
	t.Helper()
	select {
	case <-w.hits:
	case <-time.After(testenv.WaitTimeout):
		t.Fatalf("no log line %q within %v", w.match, testenv.WaitTimeout)
	}
}

// refuseResults makes the database refuse every write of a succeeded
// command (a trigger raising an error), as a deadlock or a restart does
// for the gateway's batch; the returned function lifts it.
func refuseResults(t *testing.T, db *store.DB) func() {
	t.Helper()
	ctx := context.Background()
	stmts, lift := []string{
		`CREATE TRIGGER bc_refuse_results BEFORE UPDATE ON commands WHEN NEW.state = 'succeeded' BEGIN SELECT RAISE(ABORT, 'injected fault'); END`,
	}, `DROP TRIGGER bc_refuse_results`
	if db.Dialect == store.Postgres {
		stmts = []string{
			`CREATE FUNCTION bc_refuse_results() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected fault'; END $$`,
			`CREATE TRIGGER bc_refuse_results BEFORE UPDATE ON commands FOR EACH ROW WHEN (NEW.state = 'succeeded') EXECUTE FUNCTION bc_refuse_results()`,
		}
		lift = `DROP TRIGGER bc_refuse_results ON commands`
	}
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatalf("install fault: %v", err)
		}
	}
	return func() {
		if _, err := db.ExecContext(ctx, lift); err != nil {
			t.Fatalf("lift fault: %v", err)
		}
	}
}

// TestResultResentWithinSession checks that a result whose ack never
// came is sent again on the same session: the database refuses the
// result (the gateway then sends no ack), and the node sends it again
// DefaultResendAfter later by its own clock, then twice as long after
// that, never earlier, until the control plane records it, all without a
// reconnect. The node's clock is a fake that only the test moves.
func TestResultResentWithinSession(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		refused := &lineWatch{match: []byte("update refused"), hits: make(chan struct{}, 16)}
		e := testenv.Start(t, db, testenv.Options{LogTo: refused})
		clk := clock.NewFake(time.Now())
		j := e.Join(t, pki.RoleNode, "")
		a := openAgent(t, j.Dir, e.CP.GatewayAddr, clk, driver.NewSim("n"))
		a.run(t)
		a.waitState(t, true)
		// The session waits on two timers of the node's clock: renewal and
		// the trust-bundle refresh ticker (daemon.RefreshInterval, which
		// this test never reaches).
		blockUntil(t, clk, 2)

		lift := refuseResults(t, db)
		c, err := e.CP.Commands.Create(context.Background(), operator, a.NodeID(), kinds.DiagRun, nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		refused.wait(t)
		// The result went out and was refused: the node now waits for its
		// ack on a third timer, and sends it again when that passes.
		blockUntil(t, clk, 3)
		clk.Advance(daemon.DefaultResendAfter - time.Millisecond)
		if clk.Waiters() != 3 {
			t.Fatal("result resent before DefaultResendAfter")
		}
		clk.Advance(time.Millisecond)
		refused.wait(t)
		blockUntil(t, clk, 3)
		clk.Advance(2*daemon.DefaultResendAfter - time.Millisecond)
		if clk.Waiters() != 3 {
			t.Fatal("second resend before twice DefaultResendAfter")
		}
		lift()
		clk.Advance(time.Millisecond)
		got := e.WaitCommand(t, c.ID)
		if got.State != "succeeded" || !got.Attested {
			t.Fatalf("command %s attested=%v, want succeeded and attested", got.State, got.Attested)
		}
		if n := a.sessions.Load(); n != 1 {
			t.Fatalf("%d sessions, want the result on the first", n)
		}
	})
}

// TestResultOfOldWorkerReachesNewSession checks that a result the
// previous session's worker finishes after the node reconnected goes out
// on the new session at once: the connection drops while diag.run runs,
// the node reconnects, then the command finishes and the control plane
// records its result with no further reconnect and no clock moved.
func TestResultOfOldWorkerReachesNewSession(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		j := e.Join(t, pki.RoleNode, "")
		p := startSwitchProxy(t, e.CP.GatewayAddr, true)
		drv := &gatedDriver{Sim: driver.NewSim("n"), started: make(chan string, 4), release: make(chan struct{})}
		a := openAgent(t, j.Dir, p.addr(), clock.NewFake(time.Now()), drv)
		// Reconnect at once (the wall clock paces it; zero jitter).
		daemon.SetReconnectPacing(a.Node, clock.Real{}, func(time.Duration) time.Duration { return 0 })
		a.run(t)
		a.waitState(t, true)

		c, err := e.CP.Commands.Create(context.Background(), operator, a.NodeID(), kinds.DiagRun, nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-drv.started:
		case <-time.After(testenv.WaitTimeout):
			t.Fatal("diag.run did not start")
		}
		p.cut()
		a.waitState(t, false)
		a.waitState(t, true)
		close(drv.release)
		got := e.WaitCommand(t, c.ID)
		if got.State != "succeeded" || !got.Attested {
			t.Fatalf("command %s attested=%v, want succeeded and attested", got.State, got.Attested)
		}
		if n := a.sessions.Load(); n != 2 {
			t.Fatalf("%d sessions, want the result on the second", n)
		}
		if runs := drv.Runs(kinds.DiagRun); runs != 1 {
			t.Fatalf("diag.run ran %d times", runs)
		}
	})
}

// TestBackoffRestartsAfterHello checks the reconnect back-off on a fake
// clock with no jitter: a gateway that accepts and drops before any Hello
// makes each wait twice the last (1 s, 2 s, 4 s, ...), while a session
// that got its Welcome, however short, makes the next wait the minimum
// again, each time it happens, and the doubling resumes from there.
func TestBackoffRestartsAfterHello(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	j := e.Join(t, pki.RoleNode, "")
	p := startSwitchProxy(t, e.CP.GatewayAddr, false)
	a := openAgent(t, j.Dir, p.addr(), clock.NewFake(time.Now()), driver.NewSim("n"))
	pace := clock.NewFake(time.Now())
	// The jitter draws the ceiling itself, and tells the test each one.
	ceilings := make(chan time.Duration, 16)
	daemon.SetReconnectPacing(a.Node, pace, func(ceiling time.Duration) time.Duration {
		ceilings <- ceiling
		return ceiling
	})
	a.run(t)

	// wantWait checks that the node's next reconnect waits exactly d on
	// the pacing clock, then lets it reconnect.
	wantWait := func(d time.Duration) {
		t.Helper()
		select {
		case c := <-ceilings:
			if c != d {
				t.Fatalf("reconnect back-off %v, want %v", c, d)
			}
		case <-time.After(testenv.WaitTimeout):
			t.Fatalf("no reconnect wait within %v", testenv.WaitTimeout)
		}
		blockUntil(t, pace, 1)
		pace.Advance(d - time.Millisecond)
		if pace.Waiters() != 1 {
			t.Fatalf("reconnected before %v", d)
		}
		pace.Advance(time.Millisecond)
	}
	wantWait(time.Second)
	wantWait(2 * time.Second)
	wantWait(4 * time.Second)
	for range 3 {
		// A gateway restart: the session came up (Hello answered) and
		// the connection is cut.
		c := <-ceilings
		blockUntil(t, pace, 1)
		p.forward.Store(true)
		pace.Advance(c)
		a.waitState(t, true)
		p.forward.Store(false)
		p.cut()
		a.waitState(t, false)
		wantWait(time.Second)
	}
	wantWait(2 * time.Second)
	wantWait(4 * time.Second)
}
