package wgtun

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

var (
	cpAddr      = netip.MustParseAddr("100.100.0.1")
	bastionAddr = netip.MustParseAddr("100.100.0.2")
	loopback    = netip.MustParseAddr("127.0.0.1")
)

// logBuffer is a goroutine-safe buffer for a slog text handler.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func debugLogger(b *logBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func mustKey(t testing.TB) Key {
	t.Helper()
	k, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func single(a netip.Addr) netip.Prefix {
	return netip.PrefixFrom(a, a.BitLen())
}

// pair is a control plane end ("cp", 100.100.0.1, UDP on 127.0.0.1 only) and
// a bastion end (100.100.0.2, UDP on every address, dialling the cp with a
// 25 s keepalive), each the other's only peer.
type pair struct {
	cp, bastion       *Tunnel
	cpKey, bastionKey Key
}

func newPair(t testing.TB, log *slog.Logger) pair {
	t.Helper()
	p := pair{cpKey: mustKey(t), bastionKey: mustKey(t)}
	var err error
	p.cp, err = Up(Config{
		PrivateKey: p.cpKey, Address: cpAddr, ListenAddr: loopback, Log: log,
		Peers: []Peer{{PublicKey: p.bastionKey.Public(), AllowedIP: single(bastionAddr)}},
	})
	if err != nil {
		t.Fatalf("Up(cp): %v", err)
	}
	t.Cleanup(func() { p.cp.Close() })
	p.bastion, err = Up(Config{
		PrivateKey: p.bastionKey, Address: bastionAddr, Log: log,
		Peers: []Peer{{
			PublicKey: p.cpKey.Public(), AllowedIP: single(cpAddr),
			Endpoint: netip.AddrPortFrom(loopback, p.cp.Port()), Keepalive: 25 * time.Second,
		}},
	})
	if err != nil {
		t.Fatalf("Up(bastion): %v", err)
	}
	t.Cleanup(func() { p.bastion.Close() })
	return p
}

// serveEcho accepts on ln and echoes each connection; it sends each accepted
// connection's remote address on remotes (if not nil).
func serveEcho(ln net.Listener, remotes chan<- netip.Addr) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if remotes != nil {
			remotes <- remoteAddr(c)
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

// echoOnce writes msg on c and reads it back within the deadline.
func echoOnce(t testing.TB, c net.Conn, msg []byte) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		errc <- err
	}()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("reading the echo: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("writing: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo differs from what was sent")
	}
}

// wantRefused fails unless err is a *RefusedError with reason.
func wantRefused(t testing.TB, err error, reason string) {
	t.Helper()
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("error = %v, want a *RefusedError %q", err, reason)
	}
	if re.Reason != reason {
		t.Fatalf("reason = %q (%s), want %q", re.Reason, re.Detail, reason)
	}
}

func dialCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// remoteAddr is c's remote IP, or the zero Addr when it cannot be read.
func remoteAddr(c net.Conn) netip.Addr {
	a, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok || a == nil {
		return netip.Addr{}
	}
	return a.AddrPort().Addr().Unmap()
}
