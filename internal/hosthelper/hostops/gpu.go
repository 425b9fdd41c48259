package hostops

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"syscall"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// GPUResetter resets one GPU: the hardware edge of ResetGPU. It gets the
// GPU as the host's own inventory describes it, never as a request does.
type GPUResetter interface {
	Reset(ctx context.Context, gpu *nodev1.Gpu) error
}

// pciAddress is a PCI address as sysfs names a device
// (domain:bus:device.function).
var pciAddress = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// ResetGPU resets the GPU id names, which must be a GPU of inv, the
// host's own inventory (else CodeGPUUnknown); the reset goes to the PCI
// address inv holds for it. A GPU without a well-formed PCI address, or
// no resetter configured, is CodeFailed.
func (o *Ops) ResetGPU(ctx context.Context, id string, inv *nodev1.Inventory) error {
	var gpu *nodev1.Gpu
	for _, g := range inv.GetGpus() {
		if id != "" && g.GetId() == id {
			gpu = g
			break
		}
	}
	if gpu == nil {
		return refuse(helperwire.CodeGPUUnknown, "no GPU %q in this host's inventory", truncate(id, 64))
	}
	if !pciAddress.MatchString(gpu.GetPciAddress()) {
		return refuse(helperwire.CodeFailed, "GPU %q has no PCI address in the inventory", id)
	}
	if o.GPU == nil {
		return refuse(helperwire.CodeFailed, "no GPU resetter on this host")
	}
	if err := o.GPU.Reset(ctx, gpu); err != nil {
		return fmt.Errorf("hostops: reset GPU %s: %w", id, err)
	}
	return nil
}

// DefaultPCIDevices is where sysfs lists PCI devices.
const DefaultPCIDevices = "/sys/bus/pci/devices"

// SysfsResetter resets a GPU by writing "1" to its PCI function-level
// reset file, <Devices>/<address>/reset.
type SysfsResetter struct {
	// Devices is the PCI device directory; "" means DefaultPCIDevices.
	Devices string
}

// Reset writes "1" to the reset file of gpu's PCI address (checked again
// here: the address is a path component). The file is opened with
// O_NOFOLLOW: sysfs's reset is a plain attribute file, never a link.
func (r SysfsResetter) Reset(_ context.Context, gpu *nodev1.Gpu) error {
	addr := gpu.GetPciAddress()
	if !pciAddress.MatchString(addr) {
		return fmt.Errorf("hostops: PCI address %q is malformed", addr)
	}
	dir := r.Devices
	if dir == "" {
		dir = DefaultPCIDevices
	}
	path := filepath.Join(dir, addr, "reset")
	f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("hostops: open %s: %w", path, err)
	}
	_, err = f.Write([]byte("1"))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("hostops: write %s: %w", path, err)
	}
	return nil
}

// truncate cuts s to at most n bytes for a reason.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
