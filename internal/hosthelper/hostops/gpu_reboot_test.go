package hostops

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// recordGPU records the GPUs it was asked to reset.
type recordGPU struct{ addrs []string }

func (r *recordGPU) Reset(_ context.Context, g *nodev1.Gpu) error {
	r.addrs = append(r.addrs, g.GetPciAddress())
	return nil
}

// testInventory has two GPUs, and a third with a path in its address.
func testInventory() *nodev1.Inventory {
	return &nodev1.Inventory{Gpus: []*nodev1.Gpu{
		{Id: "gpu0", PciAddress: "0000:18:00.0"},
		{Id: "gpu1", PciAddress: "0000:19:00.0"},
		{Id: "bad", PciAddress: "../../../../etc"},
	}}
}

// TestResetGPU: a GPU of the inventory is reset at the inventory's
// address; an id not in it (or empty, or no inventory) is refused
// CodeGPUUnknown and nothing is reset; a malformed address in the
// inventory, or no resetter, is CodeFailed.
func TestResetGPU(t *testing.T) {
	rec := &recordGPU{}
	o := &Ops{GPU: rec}
	ctx := context.Background()
	if err := o.ResetGPU(ctx, "gpu1", testInventory()); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"gpu2", "", "0000:18:00.0", "GPU0"} {
		wantCode(t, o.ResetGPU(ctx, id, testInventory()), helperwire.CodeGPUUnknown)
	}
	wantCode(t, o.ResetGPU(ctx, "gpu0", nil), helperwire.CodeGPUUnknown)
	wantCode(t, o.ResetGPU(ctx, "bad", testInventory()), helperwire.CodeFailed)
	if strings.Join(rec.addrs, ",") != "0000:19:00.0" {
		t.Fatalf("reset %v, want only gpu1's address", rec.addrs)
	}
	wantCode(t, (&Ops{}).ResetGPU(ctx, "gpu0", testInventory()), helperwire.CodeFailed)
}

// TestSysfsResetter: "1" goes to <devices>/<address>/reset; a symlink
// at reset is not followed (its target keeps its content); a malformed
// address is refused before any path is made of it.
func TestSysfsResetter(t *testing.T) {
	devs := t.TempDir()
	dev := filepath.Join(devs, "0000:18:00.0")
	if err := os.Mkdir(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dev, "reset"), nil, 0o200); err != nil {
		t.Fatal(err)
	}
	r := SysfsResetter{Devices: devs}
	ctx := context.Background()
	if err := r.Reset(ctx, &nodev1.Gpu{PciAddress: "0000:18:00.0"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dev, "reset")); string(got) != "1" {
		t.Fatalf("reset holds %q", got)
	}
	victim := filepath.Join(devs, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(devs, "0000:19:00.0")
	if err := os.Mkdir(link, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(link, "reset")); err != nil {
		t.Fatal(err)
	}
	if err := r.Reset(ctx, &nodev1.Gpu{PciAddress: "0000:19:00.0"}); err == nil {
		t.Fatal("wrote through a symlink")
	}
	if got, _ := os.ReadFile(victim); string(got) != "keep" {
		t.Fatalf("victim holds %q", got)
	}
	if err := r.Reset(ctx, &nodev1.Gpu{PciAddress: "../victim"}); err == nil {
		t.Fatal("reset a malformed address")
	}
}

// recordReboot records the reason it was given.
type recordReboot struct{ reasons []string }

func (r *recordReboot) Reboot(_ context.Context, reason string) error {
	r.reasons = append(r.reasons, reason)
	return nil
}

// TestReboot: the rebooter gets the cleaned reason; none configured is
// CodeFailed.
func TestReboot(t *testing.T) {
	rec := &recordReboot{}
	o := &Ops{Rebooter: rec}
	if err := o.Reboot(context.Background(), "kernel update\n\x1b[31mred\u202e"); err != nil {
		t.Fatal(err)
	}
	if len(rec.reasons) != 1 || rec.reasons[0] != "kernel update[31mred" {
		t.Fatalf("reasons %q", rec.reasons)
	}
	wantCode(t, (&Ops{}).Reboot(context.Background(), "x"), helperwire.CodeFailed)
}

// TestCleanReason: cut to MaxRebootReason bytes on a character
// boundary, controls and invalid UTF-8 dropped.
func TestCleanReason(t *testing.T) {
	long := strings.Repeat("é", 150) // 300 bytes
	got := CleanReason(long)
	if len(got) != helperwire.MaxRebootReason || !utf8.ValidString(got) {
		t.Fatalf("%d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	got = CleanReason("a" + strings.Repeat("é", 150))
	if len(got) != helperwire.MaxRebootReason-1 || !utf8.ValidString(got) {
		t.Fatalf("%d bytes, valid %v: a character was split", len(got), utf8.ValidString(got))
	}
	if got := CleanReason("a\x00b\tc\xffd\r\ne"); got != "abcde" {
		t.Fatalf("got %q", got)
	}
}

// TestSystemctlRebooter: systemctl runs with exactly reboot and
// --message=<reason>, the reason one argument even when it looks like an
// option; a failing systemctl is an error.
func TestSystemctlRebooter(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "argv")
	bin := filepath.Join(dir, "systemctl")
	script := "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > " + out + "\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := (SystemctlRebooter{Systemctl: bin}).Reboot(context.Background(), "--force now; rm -rf /"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(out)
	if string(got) != "reboot\n--message=--force now; rm -rf /\n" {
		t.Fatalf("argv %q", got)
	}
	if err := (SystemctlRebooter{Systemctl: "/bin/false"}).Reboot(context.Background(), "x"); err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want a failure", err)
	}
}

// FuzzCleanReason: whatever comes in, the reason is valid UTF-8, at most
// MaxRebootReason bytes, with no control or format character.
func FuzzCleanReason(f *testing.F) {
	f.Fuzz(func(t *testing.T, in string) {
		got := CleanReason(in)
		if len(got) > helperwire.MaxRebootReason || !utf8.ValidString(got) {
			t.Fatalf("%q", got)
		}
		for _, r := range got {
			if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
				t.Fatalf("kept %U", r)
			}
		}
	})
}
