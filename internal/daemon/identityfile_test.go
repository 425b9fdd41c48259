package daemon

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/secretfile"
)

// TestOpenRefusesReadableIdentity: the node's private key file
// (identity.json) that group or other may access is refused at start,
// as ssh refuses an open private key; made private again, it opens.
func TestOpenRefusesReadableIdentity(t *testing.T) {
	f := newFixture(t)
	n, _, _ := openTestNode(t, f, 0)
	dir := n.cfg.DataDir
	n.Close()
	path := filepath.Join(dir, identityFile)
	open := func() error {
		n, err := Open(Config{DataDir: dir, Driver: driver.NewSim("n1"), Clock: clock.NewFake(f.now), Log: slog.New(slog.DiscardHandler)})
		if err == nil {
			n.Close()
		}
		return err
	}
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if err := open(); !errors.Is(err, secretfile.ErrOpen) {
			t.Fatalf("identity.json mode %04o: %v, want refused (%v)", mode, err, secretfile.ErrOpen)
		}
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := open(); err != nil {
		t.Fatalf("identity.json mode 0600: %v", err)
	}
}
