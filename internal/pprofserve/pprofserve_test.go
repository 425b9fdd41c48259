package pprofserve

import (
	"context"
	"errors"
	"testing"
)

// Profiles are served on loopback only: any other address is refused
// before anything listens.
func TestServeRefusesNonLoopback(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, addr := range []string{"0.0.0.0:6060", ":6060", "[::]:6060", "10.0.0.1:6060", "example.com:6060", "127.0.0.1"} {
		if err := Serve(ctx, addr); !errors.Is(err, ErrNotLoopback) {
			t.Errorf("Serve(%q) = %v, want ErrNotLoopback", addr, err)
		}
	}
	if err := Serve(ctx, "127.0.0.1:0"); err != nil {
		t.Fatalf("Serve on loopback: %v", err)
	}
}
