package netguard

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"
)

var benchAddrs = []netip.Addr{
	netip.MustParseAddr("8.8.8.8"),
	netip.MustParseAddr("10.1.2.3"),
	netip.MustParseAddr("203.0.113.9"),
	netip.MustParseAddr("2606:4700:4700::1111"),
	netip.MustParseAddr("::ffff:169.254.169.254"),
	netip.MustParseAddr("64:ff9b::a00:1"),
	netip.MustParseAddr("2001:0:808:808::f5ff:fffe"),
	netip.MustParseAddr("fd00:ec2::254"),
}

// BenchmarkClassify is the per-address cost of the static rules.
func BenchmarkClassify(b *testing.B) {
	var sink Reason
	for i := 0; b.Loop(); i++ {
		sink = Classify(benchAddrs[i%len(benchAddrs)])
	}
	_ = sink
}

// BenchmarkCheckThisMachine is the per-address cost of asking the kernel
// (interface addresses and a route lookup; no packet is sent) for a
// public-looking address, alone and as part of a full CheckAddr.
func BenchmarkCheckThisMachine(b *testing.B) {
	a := netip.MustParseAddr("11.22.33.44")
	b.Run("LocalChecker", func(b *testing.B) {
		lc := NewLocalChecker()
		ctx := context.Background()
		for b.Loop() {
			if _, _, err := lc.IsLocal(ctx, a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("CheckAddr", func(b *testing.B) {
		d, err := NewDialer(Config{Resolver: newFakeResolver(nil)})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		for b.Loop() {
			d.CheckAddr(ctx, a)
		}
	})
}

// sourceServer serves size bytes to every connection on loopback.
func sourceServer(b *testing.B, size int) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ln.Close() })
	payload := make([]byte, 64<<10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for left := size; left > 0; {
					n := min(left, len(payload))
					if _, err := c.Write(payload[:n]); err != nil {
						return
					}
					left -= n
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func readAll(b *testing.B, r io.Reader, want int) {
	n, err := io.Copy(io.Discard, r)
	if err != nil || int(n) != want {
		b.Fatalf("read %d bytes, %v; want %d", n, err, want)
	}
}

// BenchmarkProxyVsDirect transfers the same payload from a loopback server
// directly and through the egress proxy (CONNECT), in the same process and
// the same loop, and reports proxied/direct, the ratio of their times. The
// loopback target is allowed through the allow list for this benchmark
// only.
func BenchmarkProxyVsDirect(b *testing.B) {
	for _, size := range []int{1 << 10, 1 << 20, 16 << 20} {
		b.Run(fmt.Sprintf("size=%dKiB", size>>10), func(b *testing.B) {
			target := sourceServer(b, size)
			d, err := NewDialer(Config{Resolver: newFakeResolver(nil), Allow: []string{"127.0.0.1"}})
			if err != nil {
				b.Fatal(err)
			}
			p, err := NewProxy(ProxyConfig{Dialer: d})
			if err != nil {
				b.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- p.Serve(ctx, ln) }()
			b.Cleanup(func() { cancel(); <-done })
			proxyAddr := ln.Addr().String()
			req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n"

			var direct, proxied time.Duration
			b.SetBytes(int64(2 * size))
			for b.Loop() {
				t0 := time.Now()
				c, err := net.Dial("tcp", target)
				if err != nil {
					b.Fatal(err)
				}
				readAll(b, c, size)
				_ = c.Close()
				t1 := time.Now()
				pc, err := net.Dial("tcp", proxyAddr)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.WriteString(pc, req); err != nil {
					b.Fatal(err)
				}
				br := bufio.NewReader(pc)
				resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
				if err != nil || resp.StatusCode != http.StatusOK {
					b.Fatalf("CONNECT: %v %v", resp, err)
				}
				readAll(b, br, size)
				_ = pc.Close()
				proxied += time.Since(t1)
				direct += t1.Sub(t0)
			}
			n := float64(b.N)
			b.ReportMetric(float64(direct.Nanoseconds())/n, "direct-ns/xfer")
			b.ReportMetric(float64(proxied.Nanoseconds())/n, "proxied-ns/xfer")
			b.ReportMetric(float64(proxied)/float64(direct), "proxied/direct")
		})
	}
}
