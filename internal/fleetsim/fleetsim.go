// Package fleetsim runs many simulated nodes in one process, each on the
// real daemon code path: its own key, join, certificate, mutual-TLS
// session, journal and signature checks, with the sim driver. Only what
// does not change security is shared: the process, the Go runtime, and one
// memo of verified worker chains (pki.WorkerChainCache). The memo caches a
// pure function of the worker certificate, the command roots, the trust
// domain and the validity window, keyed by all of them, so sharing it does
// not change what any node checks: each node still verifies the Ed25519
// signature over its own command and every field of it, and a chain the
// memo has not seen, or a time outside its window, is verified in full. It
// is what `bcd simulate` and bench/fleet use to put thousands of nodes on
// a gateway.
package fleetsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/pki"
)

// Options configure a simulated fleet.
type Options struct {
	Nodes   int
	Gateway string
	// Tokens are join tokens, one per node not yet joined.
	Tokens  []string
	DataDir string
	// JoinRate bounds joins per second (0: as fast as Parallel allows).
	JoinRate float64
	// Parallel is how many joins run at once (default 32).
	Parallel int
	Log      *slog.Logger
	// Progress, when set, is called after every join with the count.
	Progress func(joined int)
	// Clock is the nodes' clock (default the wall clock).
	Clock clock.Clock
}

// Report is what a run measured.
type Report struct {
	Nodes          int     `json:"nodes"`
	Joined         int     `json:"joined"`
	AlreadyJoined  int     `json:"already_joined"`
	JoinSeconds    float64 `json:"join_seconds"`
	JoinsPerSecond float64 `json:"joins_per_second"`
	Connected      int     `json:"connected"`
}

// Fleet is a running simulated fleet.
type Fleet struct {
	Nodes []*daemon.Node
	// WorkerChains is the one memo of verified worker chains every node of
	// the fleet uses (see the package comment).
	WorkerChains *pki.WorkerChainCache
	connected    atomic.Int64
	changed      chan struct{}
	cancel       context.CancelFunc
	group        errgroup.Group // the nodes' session loops
}

// Start joins the nodes that are not joined yet (at the configured rate),
// opens every node and starts its session loop. It returns once every node
// is joined; sessions come up in the background (see WaitConnected).
func Start(ctx context.Context, o Options) (*Fleet, Report, error) {
	if o.Nodes <= 0 {
		return nil, Report{}, errors.New("fleetsim: --nodes must be positive")
	}
	if o.Parallel <= 0 {
		o.Parallel = 32
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	rep := Report{Nodes: o.Nodes}
	dirs := make([]string, o.Nodes)
	var need []int
	for i := range dirs {
		dirs[i] = filepath.Join(o.DataDir, fmt.Sprintf("node-%05d", i))
		if daemon.Joined(dirs[i]) {
			rep.AlreadyJoined++
		} else {
			need = append(need, i)
		}
	}
	if len(need) > len(o.Tokens) {
		return nil, rep, fmt.Errorf("fleetsim: %d nodes need joining but only %d tokens were given", len(need), len(o.Tokens))
	}
	start := time.Now()
	joined, err := join(ctx, o, dirs, need)
	rep.Joined = joined
	rep.JoinSeconds = time.Since(start).Seconds()
	if rep.Joined > 0 {
		rep.JoinsPerSecond = float64(rep.Joined) / rep.JoinSeconds
	}
	if err != nil {
		return nil, rep, err
	}
	f, err := open(ctx, o, dirs)
	return f, rep, err
}

// join joins the nodes dirs[need[k]] with o.Tokens[k], o.Parallel at a
// time and at most o.JoinRate a second, and returns how many joined. It
// tries every node even after one fails, and returns the first failure.
func join(ctx context.Context, o Options, dirs []string, need []int) (int, error) {
	var joined atomic.Int64
	var firstErr error
	var errMu sync.Mutex
	var g errgroup.Group
	g.SetLimit(o.Parallel)
	var tick <-chan time.Time
	if o.JoinRate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / o.JoinRate))
		defer t.Stop()
		tick = t.C
	}
	for k, i := range need {
		if tick != nil {
			<-tick
		}
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error {
			_, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: dirs[i], Gateway: o.Gateway, Token: o.Tokens[k], Name: fmt.Sprintf("sim-%05d", i)})
			if err != nil {
				errMu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("fleetsim: join node %d: %w", i, err)
				}
				errMu.Unlock()
				return nil
			}
			if n := joined.Add(1); o.Progress != nil {
				o.Progress(int(n))
			}
			return nil
		})
	}
	_ = g.Wait()
	return int(joined.Load()), firstErr
}

// open opens every node and starts its session loop until Stop.
func open(ctx context.Context, o Options, dirs []string) (*Fleet, error) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	// One memo for the whole fleet: every node gets commands signed under
	// the same worker keys (see the package comment).
	chains := pki.NewWorkerChainCache(0)
	f := &Fleet{WorkerChains: chains, cancel: cancel, changed: make(chan struct{}, 1)}
	for i, dir := range dirs {
		n, err := daemon.Open(daemon.Config{DataDir: dir, Gateway: o.Gateway, Driver: driver.NewSim(fmt.Sprintf("sim-%05d", i)), Clock: o.Clock,
			Log: o.Log, Labels: map[string]string{"sim": "true", "fleet": "bench"}, MaxBackoff: 10 * time.Second, WorkerChains: chains})
		if err != nil {
			f.Stop()
			return nil, fmt.Errorf("fleetsim: open node %d: %w", i, err)
		}
		n.OnState(f.onState)
		f.Nodes = append(f.Nodes, n)
		f.group.Go(func() error { _ = n.Run(rctx); return nil })
	}
	return f, nil
}

// onState counts a node's session going up or down and wakes
// WaitConnected.
func (f *Fleet) onState(up bool) {
	if up {
		f.connected.Add(1)
	} else {
		f.connected.Add(-1)
	}
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// Connected returns how many sessions are up now.
func (f *Fleet) Connected() int { return int(f.connected.Load()) }

// WaitConnected waits until at least n sessions are up or ctx ends.
func (f *Fleet) WaitConnected(ctx context.Context, n int) error {
	for f.Connected() < n {
		select {
		case <-f.changed:
		case <-ctx.Done():
			return fmt.Errorf("fleetsim: %d of %d connected: %w", f.Connected(), n, ctx.Err())
		}
	}
	return nil
}

// RenewAll renews every node's certificate at once (parallel at most at a
// time) and returns renewals per second.
func (f *Fleet) RenewAll(ctx context.Context, parallel int) (float64, error) {
	if parallel <= 0 {
		parallel = 64
	}
	start := time.Now()
	var g errgroup.Group
	g.SetLimit(parallel)
	var failed atomic.Int64
	for _, n := range f.Nodes {
		g.Go(func() error {
			conn, err := n.Dial()
			if err != nil {
				failed.Add(1)
				return nil
			}
			defer conn.Close()
			if err := n.Renew(ctx, conn); err != nil {
				failed.Add(1)
			}
			return nil
		})
	}
	_ = g.Wait()
	if n := failed.Load(); n > 0 {
		return 0, fmt.Errorf("fleetsim: %d renewals failed", n)
	}
	return float64(len(f.Nodes)) / time.Since(start).Seconds(), nil
}

// Stop ends every session and waits.
func (f *Fleet) Stop() {
	f.cancel()
	_ = f.group.Wait()
	for _, n := range f.Nodes {
		_ = n.Close()
	}
}

// ReadTokens reads one token per line from a 0600 file (tokens never come
// from argv).
func ReadTokens(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("fleetsim: tokens file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("fleetsim: tokens file %s must not be readable by group or other", path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fleetsim: tokens file: %w", err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out, nil
}
