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
	wg           sync.WaitGroup
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
	var joined atomic.Int64
	var firstErr error
	var errMu sync.Mutex
	work := make(chan int)
	var jwg sync.WaitGroup
	for w := 0; w < o.Parallel; w++ {
		jwg.Add(1)
		go func() {
			defer jwg.Done()
			for k := range work {
				i := need[k]
				_, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: dirs[i], Gateway: o.Gateway, Token: o.Tokens[k], Name: fmt.Sprintf("sim-%05d", i)})
				if err != nil {
					errMu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("fleetsim: join node %d: %w", i, err)
					}
					errMu.Unlock()
					continue
				}
				if n := joined.Add(1); o.Progress != nil {
					o.Progress(int(n))
				}
			}
		}()
	}
	var tick <-chan time.Time
	if o.JoinRate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / o.JoinRate))
		defer t.Stop()
		tick = t.C
	}
	for k := range need {
		if tick != nil {
			<-tick
		}
		select {
		case work <- k:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	jwg.Wait()
	rep.Joined = int(joined.Load())
	rep.JoinSeconds = time.Since(start).Seconds()
	if rep.Joined > 0 {
		rep.JoinsPerSecond = float64(rep.Joined) / rep.JoinSeconds
	}
	if firstErr != nil {
		return nil, rep, firstErr
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	// One memo for the whole fleet: every node gets commands signed under
	// the same worker keys (see the package comment).
	chains := pki.NewWorkerChainCache(0)
	f := &Fleet{WorkerChains: chains, cancel: cancel, changed: make(chan struct{}, 1)}
	for i, dir := range dirs {
		n, err := daemon.Open(daemon.Config{DataDir: dir, Gateway: o.Gateway, Driver: driver.NewSim(fmt.Sprintf("sim-%05d", i)), Clock: clock.Real{},
			Log: o.Log, Labels: map[string]string{"sim": "true", "fleet": "bench"}, MaxBackoff: 10 * time.Second, WorkerChains: chains})
		if err != nil {
			f.Stop()
			return nil, rep, fmt.Errorf("fleetsim: open node %d: %w", i, err)
		}
		n.OnState(func(up bool) {
			if up {
				f.connected.Add(1)
			} else {
				f.connected.Add(-1)
			}
			select {
			case f.changed <- struct{}{}:
			default:
			}
		})
		f.Nodes = append(f.Nodes, n)
		f.wg.Add(1)
		go func() { defer f.wg.Done(); _ = n.Run(rctx) }()
	}
	return f, rep, nil
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
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for _, n := range f.Nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			conn, err := n.Dial()
			if err != nil {
				failed.Add(1)
				return
			}
			defer conn.Close()
			if err := n.Renew(ctx, conn); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		return 0, fmt.Errorf("fleetsim: %d renewals failed", n)
	}
	return float64(len(f.Nodes)) / time.Since(start).Seconds(), nil
}

// Stop ends every session and waits.
func (f *Fleet) Stop() {
	f.cancel()
	f.wg.Wait()
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
