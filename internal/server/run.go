package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// run runs f in the roles' group until the roles' context ends; an error
// it returns stops every role (see Done).
func (cp *ControlPlane) run(f func(ctx context.Context) error) {
	cp.group.Go(func() error { return f(cp.ctx) })
}

// runLoop runs a loop that returns when its context ends, in the group.
func (cp *ControlPlane) runLoop(f func(ctx context.Context)) {
	cp.group.Go(func() error { f(cp.ctx); return nil })
}

// serveGRPC serves gs on lis in the group. When the roles' context ends it
// stops gs gracefully, letting calls in flight finish for at most
// cp.grace, then stops it (a node session is a stream that does not end by
// itself). then, when not nil, is called once gs has stopped.
func (cp *ControlPlane) serveGRPC(name string, gs *grpc.Server, lis net.Listener, then func()) {
	cp.run(func(ctx context.Context) error {
		if then != nil {
			defer then()
		}
		served := make(chan error, 1)
		go func() { served <- gs.Serve(lis) }()
		select {
		case err := <-served:
			if err != nil {
				return fmt.Errorf("server: %s: %w", name, err)
			}
			return nil
		case <-ctx.Done():
		}
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		// The grace is wall time whatever the injected clock: a fake clock
		// must not keep a process from stopping.
		t := time.NewTimer(cp.grace)
		defer t.Stop()
		select {
		case <-stopped:
		case <-t.C:
			gs.Stop()
			<-stopped
		}
		<-served
		return nil
	})
}

// serveHTTP serves hs on lis in the group. When the roles' context ends it
// shuts hs down, letting requests in flight finish for at most cp.grace,
// then closes it.
func (cp *ControlPlane) serveHTTP(name string, hs *http.Server, lis net.Listener) {
	cp.run(func(ctx context.Context) error {
		served := make(chan error, 1)
		go func() { served <- hs.Serve(lis) }()
		select {
		case err := <-served:
			return fmt.Errorf("server: %s: %w", name, err)
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), cp.grace)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			_ = hs.Close()
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("server: %s: %w", name, err)
		}
		return nil
	})
}

// every calls f every d until ctx ends.
func every(ctx context.Context, clk clock.Clock, d time.Duration, f func(ctx context.Context)) {
	tick, stop := newTicker(clk, d)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			f(ctx)
		}
	}
}

// newTicker is the one place package server makes a ticker for its loops:
// on the injected clock, so that a fake clock drives the loops in tests.
func newTicker(clk clock.Clock, d time.Duration) (<-chan time.Time, func()) {
	t := clk.NewTicker(d)
	return t.C(), t.Stop
}

// logErr logs err under msg unless ctx ended (the error is then the
// shutdown's).
func logErr(ctx context.Context, log *slog.Logger, msg string, err error) {
	if err != nil && ctx.Err() == nil {
		log.Error(msg, "err", err)
	}
}
