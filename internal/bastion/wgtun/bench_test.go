package wgtun

import (
	"io"
	"net"
	"testing"
	"time"
)

// The two benchmarks copy the same 1 MiB per iteration, one through the
// tunnel and one over plain loopback TCP, so their MB/s give the tunnel's
// cost as a ratio:
//
//	go test -run XXX -bench 'Copy$' ./internal/bastion/wgtun

const copySize = 1 << 20

func BenchmarkTunnelCopy(b *testing.B) {
	p := newPair(b, nil)
	ln, err := p.bastion.ListenTCP(11434)
	if err != nil {
		b.Fatal(err)
	}
	go serveSink(ln)
	c, err := p.cp.DialContext(dialCtx(b, 10*time.Second), "tcp", "100.100.0.2:11434")
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	benchCopy(b, c)
}

func BenchmarkLoopbackCopy(b *testing.B) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go serveSink(ln)
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	benchCopy(b, c)
}

// serveSink reads copySize bytes at a time from each connection and answers
// each with one byte, so the writer knows the copy arrived.
func serveSink(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			for {
				if _, err := io.CopyN(io.Discard, c, copySize); err != nil {
					return
				}
				if _, err := c.Write([]byte{1}); err != nil {
					return
				}
			}
		}()
	}
}

func benchCopy(b *testing.B, c net.Conn) {
	buf := make([]byte, copySize)
	ack := make([]byte, 1)
	b.SetBytes(copySize)
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, ack); err != nil {
			b.Fatal(err)
		}
	}
}
