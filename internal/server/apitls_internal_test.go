package server

import (
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/pki"
)

// The API's own certificate is issued again once half its lifetime has
// passed (on the injected clock), so a long-running serve never presents
// an expired one; before that the same certificate is served.
func TestAPICertificateIsRenewedAtHalfLife(t *testing.T) {
	dir := t.TempDir()
	kek, err := pki.CreateKEK(filepath.Join(dir, "kek"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	b, err := pki.Init(filepath.Join(dir, "pki"), "srv.bc.local", kek, clock.NewFake(start.Add(-time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := b.InternalCAKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(start)
	o := Options{Bundle: b, APINames: []string{"bc.example.com", "10.0.0.5"}, APIListen: "192.0.2.9:7780",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	src, err := newCertSource("API", clk, o.Log, start, apiCert(o, keys{internal: caKey}))
	if err != nil {
		t.Fatal(err)
	}
	first := src.cur
	leaf := first.Leaf
	if err := leaf.VerifyHostname("bc.example.com"); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{"10.0.0.5", "192.0.2.9", "127.0.0.1", "::1"} {
		if err := leaf.VerifyHostname(ip); err != nil {
			t.Fatalf("%s: %v", ip, err)
		}
	}
	clk.Advance(serverCertLifetime/2 - time.Second)
	if c, err := src.get(); err != nil || c != first {
		t.Fatalf("before half life: %v, same=%v", err, c == first)
	}
	clk.Advance(time.Second)
	c, err := src.get()
	if err != nil || c == first || !c.Leaf.NotAfter.After(leaf.NotAfter) {
		t.Fatalf("at half life: %v, renewed=%v", err, c != first)
	}
}
