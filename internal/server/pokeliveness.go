package server

import (
	"context"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/store"
)

// How often a process sends its own heartbeat through the poke channel,
// and how long after the last one it heard its listener counts as live.
// A revocation in another process reaches a cache here through the
// listener, or stops it serving within pokeBeatStale of the listener
// falling silent: under the 5 s a revocation has to take effect.
const (
	pokeBeatEvery = time.Second
	pokeBeatStale = 3 * time.Second
)

// pokeLiveness tells whether this process's poke listener hears what
// other processes send: it sends its own heartbeat through PostgreSQL
// NOTIFY every pokeBeatEvery and notes when the listener hears it back.
// The access cache serves only while it is live, and drops everything
// when the epoch changes (the listener was down or silent, so a poke may
// have been missed).
type pokeLiveness struct {
	clk     clock.Clock
	payload string

	mu    sync.Mutex
	up    bool
	last  time.Time
	epoch uint64
}

func newPokeLiveness(clk clock.Clock) *pokeLiveness {
	return &pokeLiveness{clk: clk, payload: "beat." + ids.New("p")}
}

// beat sends the heartbeat now and every pokeBeatEvery until ctx ends.
func (l *pokeLiveness) beat(ctx context.Context, db *store.DB) {
	t := l.clk.NewTicker(pokeBeatEvery)
	defer t.Stop()
	for {
		// A failed send is a missed beat: the listener goes stale.
		_ = db.Notify(ctx, pokeChannel, l.payload)
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// heard reports whether payload is this process's heartbeat, noting it
// when it is; a beat after a silence starts a new epoch.
func (l *pokeLiveness) heard(payload string) bool {
	if payload != l.payload {
		return false
	}
	now := l.clk.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.up || now.Sub(l.last) > pokeBeatStale {
		l.epoch++
	}
	l.up, l.last = true, now
	return true
}

// down notes that the listener stopped: pokes may be missed until it
// hears its heartbeat again.
func (l *pokeLiveness) down() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.up = false
	l.epoch++
}

// live is the api.Liveness of the poke listener.
func (l *pokeLiveness) live() (uint64, bool) {
	now := l.clk.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch, l.up && now.Sub(l.last) <= pokeBeatStale
}
