// Package driver is the hardware edge of bcd: every command kind runs
// through a Driver. The sim driver is a simulated machine (used by dev and
// the tests, behind the same interface as the real one); the linux driver
// runs on a real host and executes fixed argument vectors, never a shell.
package driver

import (
	"bytes"
	"context"
	"crypto/hmac"
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

// SecretsFrom returns the fetcher WithSecrets put in ctx, or nil: a
// driver resolving a reference the signed command carries (a sandbox's
// secret env) asks the broker through it, for that command.
func SecretsFrom(ctx context.Context) SecretFetcher {
	f, _ := ctx.Value(secretsKey{}).(SecretFetcher)
	return f
}

type commandKey struct{}

// WithCommand returns ctx carrying signed, the marshalled
// nodev1.SignedCommand the daemon verified before it called the driver's
// Run. A driver that hands the command on to another party (the root
// helper, which verifies it again under roots it pins itself) takes it
// from there; the daemon sets it only for a command that passed its own
// checks.
func WithCommand(ctx context.Context, signed []byte) context.Context {
	return context.WithValue(ctx, commandKey{}, signed)
}

// CommandFrom returns the signed command WithCommand put in ctx, or nil
// when there is none.
func CommandFrom(ctx context.Context) []byte {
	b, _ := ctx.Value(commandKey{}).([]byte)
	return b
}

// Bounds of the nonce a secret.digest payload carries, in bytes.
const (
	MinDigestNonce = 16
	MaxDigestNonce = 64
)

// secretDigest runs secret.digest: with the payload
// {"ref":"secret://…","nonce":"<hex, 16 to 64 bytes>"}, fetch ref and
// return only HMAC-SHA256 keyed with the secret's value over the nonce's
// bytes. Whoever knows the value checks delivery by computing the same
// HMAC; the answer is no fixed fingerprint of the value (no unkeyed hash),
// so it cannot be looked up in a table or compared across commands. A
// payload without a valid nonce is refused payload-invalid before anything
// is fetched.
func secretDigest(ctx context.Context, payload []byte) ([]byte, error) {
	ref, nonce, err := decodeDigestPayload(payload)
	if err != nil {
		return nil, err
	}
	f, _ := ctx.Value(secretsKey{}).(SecretFetcher)
	if f == nil {
		return nil, errors.New("secrets-unavailable")
	}
	v, err := f(ctx, ref)
	if err != nil {
		return nil, errors.New("secret-refused")
	}
	mac := hmac.New(sha256.New, v)
	clear(v)
	mac.Write(nonce)
	return json.Marshal(map[string]string{"ref": ref, "nonce": hex.EncodeToString(nonce), "hmac_sha256": hex.EncodeToString(mac.Sum(nil))})
}

// decodeDigestPayload decodes a secret.digest payload strictly: exactly
// the fields ref and nonce, a non-empty ref and a hex nonce of
// MinDigestNonce to MaxDigestNonce bytes.
func decodeDigestPayload(payload []byte) (ref string, nonce []byte, err error) {
	var p struct {
		Ref   string `json:"ref"`
		Nonce string `json:"nonce"`
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil || dec.More() || p.Ref == "" {
		return "", nil, errors.New("payload-invalid")
	}
	nonce, err = hex.DecodeString(p.Nonce)
	if err != nil || len(nonce) < MinDigestNonce || len(nonce) > MaxDigestNonce {
		return "", nil, errors.New("payload-invalid")
	}
	return p.Ref, nonce, nil
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
