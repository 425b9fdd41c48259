package helperwire

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
)

// The client decodes responses strictly: an unknown field, trailing bytes,
// another version or nothing at all is an error, a code is a *Refusal.
func TestDecodeResponseIsStrict(t *testing.T) {
	for _, bad := range []string{
		`{"version":1,"extra":1}`,
		`{"version":1}x`,
		`{"version":1}{"version":1}`,
		`{"version":2}`,
		`null`,
		``,
	} {
		if _, err := DecodeResponse([]byte(bad)); err == nil {
			t.Errorf("DecodeResponse(%q) accepted", bad)
		}
	}
	r, err := DecodeResponse([]byte(`{"version":1,"code":"peer-uid","reason":"no"}`))
	if err != nil || r.Code != CodePeerUID {
		t.Fatalf("refusal: %+v %v", r, err)
	}
}

// Call answers a refusal as *Refusal with the helper's code, and a helper
// that never answers holds the caller only until its context ends.
func TestCallRefusalAndContext(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	c := &Client{Socket: sock}
	go func() {
		conn := <-accepted
		_, _ = io.Copy(io.Discard, conn) // read the request to its end
		_, _ = conn.Write([]byte(`{"version":1,"code":"op-unknown","reason":"x"}`))
		conn.Close()
	}()
	_, err = c.Call(context.Background(), &Request{Op: "nope"})
	var ref *Refusal
	if !errors.As(err, &ref) || ref.Code != CodeUnknownOp {
		t.Fatalf("refusal: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	held := make(chan net.Conn, 1)
	go func() {
		held <- <-accepted // hold the connection open, never answer
		cancel()
	}()
	_, err = c.Call(ctx, &Request{Op: OpPing})
	(<-held).Close()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("silent helper: %v, want context.Canceled", err)
	}
}
