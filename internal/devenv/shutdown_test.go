package devenv_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/bettercompute/bettercompute/internal/devenv"
)

// lockedBuffer is a bytes.Buffer safe for the loggers of many goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// dev stops as `better-compute dev` does on Ctrl-C (its context ends, then
// Close) without a warning or an error in its log: no session closing into
// a closed database, no loop failing on the way down; with --bastion too
// (the bastion stops before the control plane).
func TestDevStopsWithoutErrorLines(t *testing.T) {
	for _, bastion := range []bool{false, true} {
		t.Run(map[bool]string{false: "nodes", true: "bastion"}[bastion], func(t *testing.T) {
			var logs lockedBuffer
			ctx, cancel := context.WithCancel(context.Background())
			o := devenv.Options{DataDir: filepath.Join(t.TempDir(), "dev"), Nodes: 2, APIListen: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0",
				Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})), Out: io.Discard, Bastion: bastion}
			e, err := devenv.Start(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			cancel()
			e.Close()
			for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				if line != "" {
					t.Errorf("logged at shutdown: %s", line)
				}
			}
		})
	}
}
