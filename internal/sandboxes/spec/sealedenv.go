package spec

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/bettercompute/bettercompute/internal/pki"
)

// Sealed env values. The control plane never puts a template's plain env
// value in a command: it seals each one (SealEnvValue) into
// "sealed-env:TENANT:B64", AES-256-GCM under the sandbox's env data key
// with authenticated data naming the sandbox and the variable. The data
// key (EnvDataKey) is HMAC-SHA256 of the tenant and the sandbox id under
// a key derived from the key-encryption key (EnvKey); the host fetches it
// from the secrets broker as the reference "sealed-env-key:TENANT/SANDBOX"
// (EnvKeyRef), for the live command it runs, exactly as it fetches a
// secret reference, and keeps the opened values in memory only. A sandbox
// carries an environment in exactly one payload (its cold create, or the
// update that claims it warm), so its id names that payload's key: an
// exec after a bcd restart can name the same key without the control
// plane storing anything more.

// SealedEnvPrefix starts a sealed env value; EnvKeyRefPrefix starts the
// reference of the data key that opens one. Neither is a secret
// reference (secret://), so no value is both.
const (
	SealedEnvPrefix = "sealed-env:"
	EnvKeyRefPrefix = "sealed-env-key:"
)

// ReasonEnvUnavailable is a host's refusal of a sandbox (create, claim or
// exec) whose sealed env value it could not open: its key refused by the
// broker, no broker on the path, or a value that does not open (tampered,
// moved to another sandbox or variable, or sealed under an older
// key-encryption key). The sandbox never runs with the variable missing.
const ReasonEnvUnavailable = "env-unavailable"

// maxSealedValue bounds a sealed value: a 4096-byte value sealed and
// encoded, with its prefix and tenant.
const maxSealedValue = 6 << 10

// envKeyLabel is the HKDF label of the env key under the KEK.
const envKeyLabel = "bc-sandbox-env-v1"

// EnvKey derives the key sealed env data keys are made from. Both the
// control plane (sealing) and the broker (releasing) derive it from the
// key-encryption key they hold; it is never stored.
func EnvKey(kek pki.KEK) []byte {
	k, err := hkdf.Key(sha256.New, kek[:], nil, envKeyLabel, sha256.Size)
	if err != nil {
		// hkdf.Key fails only for an output longer than 255 hashes.
		panic("spec: derive env key: " + err.Error())
	}
	return k
}

// EnvDataKey is the data key of sandbox's sealed env values for tenant:
// HMAC-SHA256(envKey, tenant || 0x00 || sandbox).
func EnvDataKey(envKey []byte, tenant, sandbox string) pki.KEK {
	m := hmac.New(sha256.New, envKey)
	m.Write([]byte(tenant))
	m.Write([]byte{0})
	m.Write([]byte(sandbox))
	var k pki.KEK
	copy(k[:], m.Sum(nil))
	return k
}

// EnvKeyRef is the broker reference of sandbox's env data key for tenant.
func EnvKeyRef(tenant, sandbox string) string { return EnvKeyRefPrefix + tenant + "/" + sandbox }

// ParseEnvKeyRef splits an env key reference into its tenant and sandbox
// id; ok is false for anything else.
func ParseEnvKeyRef(ref string) (tenant, sandbox string, ok bool) {
	rest, ok := strings.CutPrefix(ref, EnvKeyRefPrefix)
	if !ok {
		return "", "", false
	}
	tenant, sandbox, ok = strings.Cut(rest, "/")
	if !ok || !validEnvTenant(tenant) || ValidSandboxID(sandbox) != nil {
		return "", "", false
	}
	return tenant, sandbox, true
}

// validEnvTenant reports whether t can be a tenant in a sealed value or
// key reference.
func validEnvTenant(t string) bool {
	return t != "" && len(t) <= 64 && !strings.ContainsAny(t, ":/\x00")
}

// envValueAAD binds a sealed value to its tenant, sandbox and variable.
func envValueAAD(tenant, sandbox, name string) []byte {
	return []byte("bc-sandbox-env-value-v1\x00" + tenant + "\x00" + sandbox + "\x00" + name)
}

// SealEnvValue seals value of variable name of sandbox (of tenant) under
// its data key k.
func SealEnvValue(k pki.KEK, tenant, sandbox, name, value string) (string, error) {
	if !validEnvTenant(tenant) {
		return "", errors.New("spec: seal env: bad tenant")
	}
	sealed, err := pki.Seal(k, []byte(value), envValueAAD(tenant, sandbox, name))
	if err != nil {
		return "", fmt.Errorf("spec: seal env: %w", err)
	}
	return SealedEnvPrefix + tenant + ":" + base64.StdEncoding.EncodeToString(sealed), nil
}

// FromBroker reports whether env value v is one a host gets through the
// secrets broker (a secret reference, or anything that starts like a
// sealed value) rather than a plain value it passes on as it stands.
func FromBroker(v string) bool {
	_, _, ref := SecretRef(v)
	return ref || strings.HasPrefix(v, SealedEnvPrefix)
}

// SealedEnvTenant returns the tenant a sealed env value names; ok is
// false for any value that is not one.
func SealedEnvTenant(v string) (tenant string, ok bool) {
	rest, ok := strings.CutPrefix(v, SealedEnvPrefix)
	if !ok {
		return "", false
	}
	tenant, _, ok = strings.Cut(rest, ":")
	return tenant, ok && validEnvTenant(tenant)
}

// OpenEnvValue opens sealed value v of variable name of sandbox under
// data key k. Any failure is one error naming nothing of the value.
func OpenEnvValue(k pki.KEK, sandbox, name, v string) (string, error) {
	rest, ok := strings.CutPrefix(v, SealedEnvPrefix)
	if !ok {
		return "", errors.New("spec: not a sealed env value")
	}
	tenant, b64, ok := strings.Cut(rest, ":")
	if !ok || !validEnvTenant(tenant) {
		return "", errors.New("spec: not a sealed env value")
	}
	sealed, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		return "", errors.New("spec: sealed env value does not decode")
	}
	plain, err := pki.Open(k, sealed, envValueAAD(tenant, sandbox, name))
	if err != nil {
		return "", fmt.Errorf("spec: sealed env value does not open: %w", err)
	}
	defer clear(plain)
	return string(plain), nil
}
