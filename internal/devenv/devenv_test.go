package devenv_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/bettercompute/bettercompute/internal/devenv"
)

// dev brings up its nodes, writes the admin key and the env file, stops
// cleanly, and a second run on the same data directory brings back the
// same fleet without joining again.
func TestDevComesBackWithTheSameFleet(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev")
	o := devenv.Options{DataDir: dir, Nodes: 2, APIListen: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Out: io.Discard}
	e, err := devenv.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	first := slices.Sorted(slices.Values(e.NodeIDs))
	for _, f := range []string{e.KeyFile, e.EnvFile} {
		if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, st, err)
		}
	}
	key, err := os.ReadFile(e.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	if len(first) != 2 {
		t.Fatalf("nodes %v, want 2", first)
	}
	e, err = devenv.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if again := slices.Sorted(slices.Values(e.NodeIDs)); !slices.Equal(again, first) {
		t.Fatalf("second run's nodes %v, want the first run's %v", again, first)
	}
	if again, _ := os.ReadFile(e.KeyFile); string(again) != string(key) {
		t.Fatal("the second run made a new admin key")
	}
}
