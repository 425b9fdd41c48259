package driver

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

func TestLinuxDiagUsesFixedArgv(t *testing.T) {
	out, err := NewLinux().Run(context.Background(), "diag.run", []byte(`{"argv":["sh","-c","touch /tmp/pwned"]}`))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Checks []struct {
			Argv []string `json:"argv"`
		} `json:"checks"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Checks) != len(diagArgv) {
		t.Fatalf("%d checks, want %d", len(res.Checks), len(diagArgv))
	}
	for i, c := range res.Checks {
		if !slices.Equal(c.Argv, diagArgv[i]) {
			t.Fatalf("check %d ran %v, want the fixed %v", i, c.Argv, diagArgv[i])
		}
		if c.Argv[0] == "sh" || c.Argv[0] == "bash" {
			t.Fatalf("diag ran a shell: %v", c.Argv)
		}
	}
}

func TestDriversRefuseUnknownKinds(t *testing.T) {
	for _, d := range []Driver{NewLinux(), NewSim("s")} {
		if _, err := d.Run(context.Background(), "bmc.powerOff", nil); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: got %v, want ErrUnsupported", d.Name(), err)
		}
	}
	if _, err := NewLinux().Run(context.Background(), "disk.wipe", nil); !errors.Is(err, ErrUnsupported) {
		t.Error("linux driver pretends to wipe disks")
	}
}

func TestSimWipeRefusesUnknownDisk(t *testing.T) {
	s := NewSim("s")
	if _, err := s.Run(context.Background(), "disk.wipe", []byte(`{"disks":["sda"]}`)); err == nil || err.Error() != "unknown-disk" {
		t.Fatalf("got %v, want unknown-disk", err)
	}
}
