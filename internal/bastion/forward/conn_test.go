package forward

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// TestIdleCountsBothDirections holds a stream open by reads alone, then
// by writes alone, and sees it closed only after Idle with neither.
func TestIdleCountsBothDirections(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	server, client := net.Pipe()
	defer client.Close()
	released := make(chan struct{})
	ic := newIdleConn(server, clk, DefaultIdle, func() { close(released) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	step := func(d time.Duration) {
		t.Helper()
		if err := clk.BlockUntil(ctx, 1); err != nil {
			t.Fatal(err)
		}
		clk.Advance(d)
		if err := clk.BlockUntil(ctx, 1); err != nil {
			t.Fatalf("stream closed early: %v", err)
		}
	}
	step(9 * time.Minute)
	go func() { _, _ = client.Write([]byte("r")) }()
	if _, err := ic.Read(make([]byte, 1)); err != nil { // a byte read at 9 min
		t.Fatal(err)
	}
	step(9 * time.Minute) // 18 min: 9 since the read
	go func() { _, _ = io.ReadFull(client, make([]byte, 1)) }()
	if _, err := ic.Write([]byte("w")); err != nil { // a byte written at 18 min
		t.Fatal(err)
	}
	step(9 * time.Minute) // 27 min: 9 since the write
	select {
	case <-released:
		t.Fatal("stream closed while active within the idle time")
	default:
	}
	clk.Advance(time.Minute) // 28 min: 10 with no byte either way
	select {
	case <-released:
	case <-ctx.Done():
		t.Fatal("idle stream not closed")
	}
	if _, err := ic.Read(make([]byte, 1)); err == nil {
		t.Fatal("read on a closed idle stream succeeded")
	}
}
