package sandboxops_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// FuzzCommand: whatever bytes the node sends as a sandbox command, each
// operation answers a refusal (command-refused, or failed for a good
// command the host cannot run) and never panics; bytes not signed by the
// pinned worker never make a sandbox.
func FuzzCommand(f *testing.F) {
	fx := newSimFixture(f)
	other := newSigner(f, fx.now) // not the helper's PKI
	good := other.command(f, fx.now, "n1", kinds.SandboxCreate, createPayload(fx.digest, spec.RuntimeSim, fx.now.Add(time.Hour)), nil)
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x03, 'c', 'm', 'd'})
	f.Add(other.command(f, fx.now, "n1", kinds.SandboxExec, spec.Exec{SandboxID: "x", Argv: []string{"a"}, TimeoutMS: 1}, nil))
	f.Fuzz(func(t *testing.T, cmd []byte) {
		for op, h := range fx.ops.Handlers() {
			if !opChanges(op) {
				continue
			}
			_, err := h(context.Background(), req(op, cmd))
			var r *helperwire.Refusal
			if err == nil || !errors.As(err, &r) || r.Code != helperwire.CodeCommand {
				t.Fatalf("%s: bytes signed under another PKI answered %v", op, err)
			}
		}
		if len(fx.host.Sandboxes()) != 0 {
			t.Fatal("unsigned bytes made a sandbox")
		}
	})
}

func opChanges(op string) bool {
	switch op {
	case helperwire.OpSandboxCreate, helperwire.OpSandboxExec, helperwire.OpSandboxUpdate, helperwire.OpSandboxDelete, helperwire.OpSandboxCheckpoint:
		return true
	}
	return false
}
