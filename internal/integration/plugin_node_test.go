package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// pluginChildUID returns the uid of a child of parent running as a uid
// of the plugins' reserved block (0x7FFE0000–0x7FFEFFFF), or -1.
func pluginChildUID(parent int) int64 {
	dirs, _ := filepath.Glob("/proc/[0-9]*/status")
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var ppid, uid int64 = -1, -1
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PPid:"); ok {
				ppid, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			}
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				uid, _ = strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			}
		}
		if ppid == int64(parent) && uid >= 0x7FFE0000 && uid <= 0x7FFEFFFF {
			return uid
		}
	}
	return -1
}

// TestRootNodeRunsItsDriverAsConfinedPlugin: `bcd node --plugin` (the
// built bcd, as root) runs its driver as a pinned plugin under its own
// uid from the reserved block, and commands reach the machine through it;
// a plugin binary whose SHA-256 is not the pin never starts the node.
func TestRootNodeRunsItsDriverAsConfinedPlugin(t *testing.T) {
	requireUnprivilegedSetup(t)
	bin := builtBcd(t)
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	pin := sha256Hex(b)
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		joined := e.Join(t, "node", "plugged")
		joined.Close()
		args := func(sum string) []string {
			return []string{"node", "--data", joined.Dir, "--driver", "sim", "--sandbox-runtime", "none", "--gateway", e.CP.GatewayAddr,
				"--plugin", bin, "--plugin-sha256", sum, "--plugin-arg", "driver-plugin", "--plugin-arg", "sim", "--plugin-arg", "--hostname", "--plugin-arg", "plugged-host"}
		}
		wrong := strings.Repeat("0", 64)
		out, err := exec.Command(bin, args(wrong)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "plugin-hash-mismatch") {
			t.Fatalf("a plugin that is not the pin: %v\n%s", err, out)
		}
		node := exec.Command(bin, args(pin)...)
		startProcess(t, "bcd node --plugin", node)
		pollUntil(t, "the plugin node connected", func() bool {
			n, err := e.Client.Node(ctx, joined.NodeID())
			return err == nil && n.Connected
		})
		if uid := pluginChildUID(node.Process.Pid); uid < 0 {
			t.Fatal("no plugin process of bcd node runs under a uid of the reserved block")
		}
		c, err := e.Client.CreateCommand(ctx, joined.NodeID(), "node.ping", json.RawMessage(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		got := e.WaitCommand(t, c.ID)
		if got.State != "succeeded" || !strings.Contains(string(got.Result), `"plugged-host"`) {
			t.Fatalf("node.ping through the plugin: %s %s %q", got.State, got.Result, got.Reason)
		}
	})
}
