package pprofserve

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
)

// freePort returns a TCP port that nothing listens on at the moment.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// Profiles are served on loopback only: any other address is refused
// before anything listens (the refused address's port stays free on every
// interface afterwards).
func TestServeRefusesNonLoopback(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, addr := range []string{"0.0.0.0:6060", ":6060", "[::]:6060", "10.0.0.1:6060", "example.com:6060", "127.0.0.1"} {
		if err := Serve(ctx, addr); !errors.Is(err, ErrNotLoopback) {
			t.Errorf("Serve(%q) = %v, want ErrNotLoopback", addr, err)
		}
	}
	for _, host := range []string{"0.0.0.0", "", "[::]"} {
		port := strconv.Itoa(freePort(t))
		addr := host + ":" + port
		if err := Serve(ctx, addr); !errors.Is(err, ErrNotLoopback) {
			t.Fatalf("Serve(%q) = %v, want ErrNotLoopback", addr, err)
		}
		// Nothing listens on the refused port: it can be bound on every
		// interface at once.
		ln, err := net.Listen("tcp", ":"+port)
		if err != nil {
			t.Fatalf("after Serve(%q) was refused, port %s is in use: %v", addr, port, err)
		}
		_ = ln.Close()
	}
	if err := Serve(ctx, "127.0.0.1:0"); err != nil {
		t.Fatalf("Serve on loopback: %v", err)
	}
}
