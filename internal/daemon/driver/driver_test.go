package driver

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestLinuxDiagUsesFixedArgv runs diag.run with PATH holding only
// recording stand-ins for the diagnostics and for sh, bash and touch: the
// processes started must be exactly the fixed argument vectors, in order,
// each run directly (no shell started, nothing from the payload: each one's
// parent is this process), and each
// check reports what its own process printed.
func TestLinuxDiagUsesFixedArgv(t *testing.T) {
	bin := t.TempDir()
	record := filepath.Join(t.TempDir(), "started")
	for _, name := range []string{"uname", "nproc", "uptime", "sh", "bash", "dash", "touch"} {
		// Each stand-in records its parent's process id too: a process
		// started directly by the driver has the test's own, one started
		// through any shell (PATH's or /bin/sh by its path) the shell's.
		script := "#!/bin/sh\n{ printf '%s' " + name + "; for a in \"$@\"; do printf ' %s' \"$a\"; done; echo \" ppid=$PPID\"; } >>" + record + "\necho out-" + name + "\n"
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin)
	out, err := NewLinux().Run(context.Background(), "diag.run", []byte(`{"argv":["sh","-c","touch /tmp/pwned"]}`))
	if err != nil {
		t.Fatal(err)
	}
	started, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, argv := range diagArgv {
		want = append(want, strings.Join(argv, " ")+" ppid="+strconv.Itoa(os.Getpid()))
	}
	if got := strings.Split(strings.TrimSuffix(string(started), "\n"), "\n"); !slices.Equal(got, want) {
		t.Fatalf("diag.run started %q, want exactly the fixed %q", got, want)
	}
	var res struct {
		Checks []struct {
			Argv   []string `json:"argv"`
			Stdout string   `json:"stdout"`
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
		if c.Stdout != "out-"+c.Argv[0]+"\n" {
			t.Fatalf("check %d reports stdout %q, want its own process's %q", i, c.Stdout, "out-"+c.Argv[0]+"\n")
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

// TestSimGPUReset: gpu.reset resets a GPU of the simulated inventory (each
// with a PCI address) and refuses one it does not have with "gpu-unknown".
func TestSimGPUReset(t *testing.T) {
	s := NewSim("s")
	for _, g := range s.Inventory().Gpus {
		if g.PciAddress == "" {
			t.Fatalf("%s has no PCI address", g.Id)
		}
	}
	out, err := s.Run(context.Background(), "gpu.reset", []byte(`{"gpu":"gpu1"}`))
	if err != nil || string(out) != `{"reset":"gpu1","resets":1}` {
		t.Fatalf("gpu.reset gpu1: %s %v", out, err)
	}
	if _, err := s.Run(context.Background(), "gpu.reset", []byte(`{"gpu":"gpu99"}`)); err == nil || err.Error() != "gpu-unknown" {
		t.Fatalf("got %v, want gpu-unknown", err)
	}
	if _, err := s.Run(context.Background(), "gpu.reset", []byte(`{`)); err == nil || err.Error() != "payload-invalid" {
		t.Fatalf("got %v, want payload-invalid", err)
	}
}
