package sandbox

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// TestRuncRestartAdoptsKnownKillsUnknown: when the host opens again (bcd
// restarted), a sandbox it has state for is adopted and keeps running
// its processes; one its runtime runs without a readable state (the
// state file lost, or never the host's) is killed and removed, with its
// bundle; and both the killed one and one the runtime lost are reported
// once the daemon listens, with their reasons.
func TestRuncRestartAdoptsKnownKillsUnknown(t *testing.T) {
	rt := runcRuntime(t)
	h, digest := testHost(t, rt, clock.Real{})
	deadline := time.Now().Add(time.Hour)
	kept, unknown, lost := createSpec(digest, deadline, 64), createSpec(digest, deadline, 64), createSpec(digest, deadline, 64)
	mustCreate(t, h, kept)
	mustCreate(t, h, unknown)
	mustCreate(t, h, lost)
	if r := execIn(t, h, kept.SandboxID, 10*time.Second, "sh", "-c", "echo adopted > /tmp/mark"); r.ExitCode != 0 {
		t.Fatalf("write: %+v", r)
	}
	// bcd stops: nothing is removed. Then one state file is lost, and
	// one sandbox dies with the runtime's help while bcd is down.
	if err := os.Remove(h.statePath(unknown.SandboxID)); err != nil {
		t.Fatal(err)
	}
	if err := h.cfg.Runtime.Remove(context.Background(), lost.SandboxID); err != nil {
		t.Fatal(err)
	}
	h2, err := OpenHost(context.Background(), h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := h2.Get(kept.SandboxID); !ok {
		t.Fatal("the known sandbox was not adopted")
	}
	if r := execIn(t, h2, kept.SandboxID, 10*time.Second, "cat", "/tmp/mark"); string(r.Stdout) != "adopted\n" {
		t.Fatalf("the adopted sandbox: %+v", r)
	}
	assertGone(t, h2, unknown.SandboxID)
	assertGone(t, h2, lost.SandboxID)
	got := map[string]string{}
	h2.OnFailed(func(id, reason string) { got[id] = reason })
	if len(got) != 2 || got[unknown.SandboxID] != ReasonUnknownToHost || got[lost.SandboxID] != ReasonLostAtRestart {
		t.Fatalf("reported %v, want %s %s and %s %s", got, unknown.SandboxID, ReasonUnknownToHost, lost.SandboxID, ReasonLostAtRestart)
	}
	h2.OnFailed(func(id, reason string) { t.Errorf("reported again: %s %s", id, reason) })
}
