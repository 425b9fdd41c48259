package sandboxops_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// TestCheckpointThroughHelper: an unprivileged node's sandbox.checkpoint
// runs in the helper like sandbox.delete (verified again there): it
// answers the stored checkpoint, a create from it restores on the
// helper's host, and the host's refusals (memory on a non-runsc sandbox,
// an unknown sandbox) come back as the node's failure reasons.
func TestCheckpointThroughHelper(t *testing.T) {
	f := newSimFixture(t)
	client := &inProcess{ops: f.ops}
	node := &sandbox.HelperDriver{Driver: driver.NewSim("n1"), Client: client, Intent: func() []byte { return []byte("intent") }}
	run := func(kind string, payload any) ([]byte, error) {
		cmd := f.s.command(t, f.now, "n1", kind, payload, nil)
		p, _ := json.Marshal(payload)
		return node.Run(driver.WithCommand(context.Background(), cmd), kind, p)
	}
	c := createPayload(f.digest, spec.RuntimeSim, f.now.Add(time.Hour))
	if _, err := run(kinds.SandboxCreate, c); err != nil {
		t.Fatalf("create: %v", err)
	}
	out, err := run(kinds.SandboxCheckpoint, spec.Checkpoint{SandboxID: c.SandboxID})
	var res spec.CheckpointResult
	if err != nil || json.Unmarshal(out, &res) != nil || res.Validate() != nil {
		t.Fatalf("checkpoint: %s (%v)", out, err)
	}
	r := createPayload(f.digest, spec.RuntimeSim, f.now.Add(time.Hour))
	r.FromCheckpoint = res.Digest
	if _, err := run(kinds.SandboxCreate, r); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if st, ok := f.host.Get(r.SandboxID); !ok || st.FromCheckpoint != res.Digest {
		t.Fatalf("restored state: %+v %v", st, ok)
	}
	if _, err := run(kinds.SandboxCheckpoint, spec.Checkpoint{SandboxID: c.SandboxID, Memory: true}); err == nil || err.Error() != spec.ReasonMemoryNeedsRunsc {
		t.Fatalf("memory on sim: %v, want %s", err, spec.ReasonMemoryNeedsRunsc)
	}
	gone := createPayload(f.digest, spec.RuntimeSim, f.now.Add(time.Hour))
	if _, err := run(kinds.SandboxCheckpoint, spec.Checkpoint{SandboxID: gone.SandboxID}); err == nil || err.Error() != "sandbox-not-found" {
		t.Fatalf("unknown sandbox: %v, want sandbox-not-found", err)
	}
}
