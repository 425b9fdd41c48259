package devenv_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/cli"
	"github.com/bettercompute/bettercompute/internal/devenv"
)

// A second dev on a data folder another dev holds is refused (exit 1, a
// message naming the folder and its lock) before it writes anything: the
// first one's env file still points at the first one's API. Once the first
// stops, the folder is free again.
func TestDevLocksItsDataFolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev")
	o := devenv.Options{DataDir: dir, Nodes: 0, APIListen: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Out: io.Discard}
	first, err := devenv.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	env, err := os.ReadFile(first.EnvFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := devenv.Start(context.Background(), o); !errors.Is(err, devenv.ErrDataDirInUse) {
		t.Fatalf("second Start: %v, want ErrDataDirInUse", err)
	}
	var out, errb bytes.Buffer
	code := cli.Main([]string{"dev", "--data", dir, "--nodes", "0", "--api", "127.0.0.1:0", "--gateway", "127.0.0.1:0"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "another better-compute dev is running with --data "+dir) || !strings.Contains(errb.String(), filepath.Join(dir, ".lock")) {
		t.Fatalf("second dev: exit %d, stderr %q", code, errb.String())
	}
	if again, _ := os.ReadFile(first.EnvFile); !bytes.Equal(again, env) {
		t.Fatalf("the refused dev rewrote %s:\n%s", first.EnvFile, again)
	}
	first.Close()
	e, err := devenv.Start(context.Background(), o)
	if err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
	e.Close()
}
