// Package pprofserve serves Go's runtime profiles (net/http/pprof) on a
// loopback address, for profiling a running better-compute or bcd only:
// profiles reveal memory and call stacks, so nothing but loopback is
// accepted.
package pprofserve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// ErrNotLoopback is returned for an address that is not on loopback.
var ErrNotLoopback = errors.New("--pprof must be a loopback address such as 127.0.0.1:6060")

// Serve listens on addr (loopback only) and serves the profiles until ctx
// ends.
func Serve(ctx context.Context, addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || (host != "127.0.0.1" && host != "::1" && host != "localhost") {
		return ErrNotLoopback
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--pprof: %w", err)
	}
	go func() { _ = srv.Serve(lis) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	return nil
}
