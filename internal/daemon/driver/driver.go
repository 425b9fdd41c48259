// Package driver is the hardware edge of bcd: every command kind runs
// through a Driver. The sim driver is a simulated machine (used by dev and
// the tests, behind the same interface as the real one); the linux driver
// runs on a real host and executes fixed argument vectors, never a shell.
package driver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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

// SecretFetcher returns a secret's value from the broker, for the command
// being run. The value lives in memory only: a driver must not write it to
// disk, a log or its result.
type SecretFetcher func(ctx context.Context, ref string) ([]byte, error)

type secretsKey struct{}

// WithSecrets returns ctx carrying f for the driver.
func WithSecrets(ctx context.Context, f SecretFetcher) context.Context {
	return context.WithValue(ctx, secretsKey{}, f)
}

// secretDigest runs secret.digest: fetch the payload's ref and return only
// its SHA-256.
func secretDigest(ctx context.Context, payload []byte) ([]byte, error) {
	var p struct {
		Ref string `json:"ref"`
	}
	if err := json.Unmarshal(payload, &p); err != nil || p.Ref == "" {
		return nil, errors.New("payload-invalid")
	}
	f, _ := ctx.Value(secretsKey{}).(SecretFetcher)
	if f == nil {
		return nil, errors.New("secrets-unavailable")
	}
	v, err := f(ctx, p.Ref)
	if err != nil {
		return nil, errors.New("secret-refused")
	}
	sum := sha256.Sum256(v)
	clear(v)
	return json.Marshal(map[string]string{"ref": p.Ref, "sha256": hex.EncodeToString(sum[:])})
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
