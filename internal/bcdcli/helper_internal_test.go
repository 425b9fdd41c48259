package bcdcli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// bcd helper binds its socket root:<node group> 0660 and serves ping to a
// caller that is root running this same executable; stopping it removes
// the socket.
func TestHelperCommandServesPing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("bcd helper runs as root")
	}
	base, err := os.MkdirTemp("/tmp", "bcd-helper-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	sock := filepath.Join(base, "run", "helper.sock")
	ready := make(chan struct{})
	cmd := newHelperCmd(func() { close(ready) })
	var stderr bytes.Buffer
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"--socket", sock, "--node-user", "nobody", "--state-dir", t.TempDir(), "--log-level", "debug"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("bcd helper exited: %v: %s", err, stderr.String())
	}
	res, err := (&helperwire.Client{Socket: sock}).Call(ctx, &helperwire.Request{Op: helperwire.OpPing})
	if err != nil {
		t.Fatal(err)
	}
	var p helperwire.Ping
	if err := json.Unmarshal(res, &p); err != nil || p.PID != int32(os.Getpid()) || p.UID != 0 {
		t.Fatalf("ping %s (%v)", res, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left after stop: %v", err)
	}
	if !strings.Contains(stderr.String(), "helper read done") || !strings.Contains(stderr.String(), "op=ping") {
		t.Fatalf("ping not logged: %s", stderr.String())
	}
}

// A malformed pin or an unknown node account is a usage error (exit 2)
// before anything is bound.
func TestHelperCommandRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"helper", "--socket", "/nonexistent/x.sock", "--node-user", "nobody", "--exe-sha256", "abc"},
		{"helper", "--socket", "/nonexistent/x.sock", "--node-user", "no-such-account-h1"},
	} {
		var out, errb bytes.Buffer
		if code := Main(args, strings.NewReader(""), &out, &errb); code != 2 {
			t.Fatalf("%v: exit %d (%s), want 2", args, code, errb.String())
		}
	}
}
