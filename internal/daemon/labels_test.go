package daemon

import (
	"testing"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
)

type labelled struct {
	driver.Driver
	labels map[string]string
}

func (l labelled) Labels() map[string]string { return l.labels }

// TestHelloLabelsRuntimeOnlyFromDriver: runtime.* labels in bcd's
// configuration are dropped; only a driver that has the runtime sets them.
func TestHelloLabelsRuntimeOnlyFromDriver(t *testing.T) {
	cfg := map[string]string{"rack": "r1", "runtime.runc": "true", "runtime.sandbox.slots": "999"}
	got := helloLabels(cfg, driver.NewSim("s"))
	if got["rack"] != "r1" || got["runtime.runc"] != "" || got["runtime.sandbox.slots"] != "" {
		t.Fatalf("labels %v", got)
	}
	got = helloLabels(cfg, labelled{Driver: driver.NewSim("s"), labels: map[string]string{"runtime.sim": "true", "rack": "forged"}})
	if got["runtime.sim"] != "true" || got["runtime.runc"] != "" || got["rack"] != "r1" {
		t.Fatalf("labels %v", got)
	}
}
