// Package driver is the hardware edge of bcd: every command kind runs
// through a Driver. The sim driver is a simulated machine (used by dev and
// the tests, behind the same interface as the real one); the linux driver
// runs on a real host and executes fixed argument vectors, never a shell.
package driver

import (
	"context"
	"errors"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// Driver runs command kinds on one machine.
type Driver interface {
	// Name is "sim" or "linux".
	Name() string
	// Inventory describes the machine for Hello.
	Inventory() *nodev1.Inventory
	// Run executes kind with its payload and returns a JSON result. An
	// error means the command failed; its text becomes the reason.
	Run(ctx context.Context, kind string, payload []byte) ([]byte, error)
}

// ErrUnsupported is returned for a kind a driver does not implement.
var ErrUnsupported = errors.New("unsupported-kind")

// New returns the driver called name, or an error naming the choices.
func New(name, hostname string) (Driver, error) {
	switch name {
	case "sim":
		return NewSim(hostname), nil
	case "linux":
		return NewLinux(), nil
	default:
		return nil, errors.New("driver must be sim or linux")
	}
}
