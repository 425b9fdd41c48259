// Package spec is the signed wire form of sandbox work: the payloads of the
// sandbox.* command kinds and the result of an exec. The control plane
// (package sandboxes) writes them into commands that the signing worker
// signs; bcd (package daemon/sandbox) parses them from the verified body and
// enforces exactly what was signed: the image digest, the limits, the
// deadline, the network mode, the user, the environment and the argv.
// Both sides validate with the same functions, so a host never trusts the
// control plane's validation.
package spec

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Runtimes a host may advertise.
const (
	RuntimeRunc  = "runc"
	RuntimeRunsc = "runsc"
	RuntimeSim   = "sim"
)

// LabelPrefix starts every label bcd sets about its sandbox runtimes
// (runtime.runc=true). Only bcd sets them, in its Hello; no API method can.
const LabelPrefix = "runtime."

// RuntimeLabel is the label a host with runtime rt advertises as "true".
func RuntimeLabel(rt string) string { return LabelPrefix + rt }

// MaxImageBytes bounds an image's tar.
const MaxImageBytes = 2 << 30

// ImageKey is where an image's tar lives in the object store: the digest
// names it, and every reader checks the bytes against the signed digest.
func ImageKey(digest string) string {
	return "images/sha256/" + strings.TrimPrefix(digest, "sha256:") + ".tar"
}

// Network modes. none is a network namespace with only loopback; egress
// adds one veth link to the host whose only reachable service is the
// host's egress proxy (the egress guard), so the sandbox reaches the
// public internet through the proxy alone.
const (
	NetworkNone   = "none"
	NetworkEgress = "egress"
)

// EgressLabel is the label ("true") of a host that can run egress
// sandboxes; placement requires it for a template with network egress.
const EgressLabel = LabelPrefix + "network.egress"

// MaxOutput caps each captured stream of an exec (past it the stream is
// drained and flagged truncated). The result travels in a node-signed
// CommandUpdate, whose gRPC messages are bounded by
// nodev1.MaxMessageBytes; MaxExecResultBytes is what both streams take
// there, and fits.
const MaxOutput = 8 << 20

// MaxExecResultBytes bounds the JSON of an ExecResult: both streams at
// MaxOutput, base64 (encoding/json's form of []byte), and the other fields.
const MaxExecResultBytes = 2*((MaxOutput+2)/3*4) + 1<<10

// MaxArgv bounds an exec's argument vector (count and total bytes).
const (
	MaxArgs     = 256
	MaxArgBytes = 32 << 10
	MaxEnv      = 64
)

// Limits are a sandbox's resource limits, enforced by the host's cgroups
// (cpu, memory, pids) and the size of its writable layer (disk).
type Limits struct {
	CPUMillis int64 `json:"cpu_millis"` // thousandths of a CPU
	MemoryMB  int64 `json:"memory_mb"`
	Pids      int64 `json:"pids"`
	DiskMB    int64 `json:"disk_mb"`
}

// Validate refuses limits outside what a host accepts.
func (l Limits) Validate() error {
	switch {
	case l.CPUMillis < 10 || l.CPUMillis > 64000:
		return errors.New("cpu_millis: between 10 and 64000")
	case l.MemoryMB < 16 || l.MemoryMB > 256<<10:
		return errors.New("memory_mb: between 16 and 262144")
	case l.Pids < 8 || l.Pids > 32768:
		return errors.New("pids: between 8 and 32768")
	case l.DiskMB < 1 || l.DiskMB > 64<<10:
		return errors.New("disk_mb: between 1 and 65536")
	}
	return nil
}

// Create is the payload of sandbox.create.
type Create struct {
	SandboxID   string            `json:"sandbox_id"`
	ImageDigest string            `json:"image_digest"` // sha256:<64 hex> of the image tar
	Runtime     string            `json:"runtime"`
	Limits      Limits            `json:"limits"`
	Network     string            `json:"network"`
	Root        bool              `json:"root"` // run as uid 0 inside (default 65534)
	Env         map[string]string `json:"env,omitempty"`
	DeadlineMS  int64             `json:"deadline_ms"` // the host stops and removes the sandbox then
	Warm        bool              `json:"warm"`        // unclaimed: no tenant env until sandbox.update claims it
	// FromCheckpoint, when set, is the digest of a checkpoint archive
	// (package checkpoint) the host fetches, verifies against this
	// digest and materializes as the new sandbox's writable layer before
	// it starts. FromMemory, runsc only and only with FromCheckpoint, is
	// the digest of the memory image archive the host restores the
	// sandbox's processes from (runsc restore) instead of starting init.
	FromCheckpoint string `json:"from_checkpoint,omitempty"`
	FromMemory     string `json:"from_memory,omitempty"`
}

// Validate checks a create payload.
func (c Create) Validate() error {
	if err := ValidSandboxID(c.SandboxID); err != nil {
		return err
	}
	if !ValidDigest(c.ImageDigest) {
		return errors.New("image_digest: sha256:<64 lowercase hex>")
	}
	switch c.Runtime {
	case RuntimeRunc, RuntimeRunsc, RuntimeSim:
	default:
		return errors.New("runtime: runc, runsc or sim")
	}
	if err := c.Limits.Validate(); err != nil {
		return err
	}
	if c.Network != NetworkNone && c.Network != NetworkEgress {
		return errors.New("network: none or egress")
	}
	if c.DeadlineMS <= 0 {
		return errors.New("deadline_ms: required")
	}
	if c.Warm && len(c.Env) > 0 {
		return errors.New("env: a warm sandbox holds no environment until claimed")
	}
	if err := c.validRestore(); err != nil {
		return err
	}
	return validEnv(c.Env, true)
}

// validRestore checks the restore fields of a create: digests, never a
// warm restore, and memory only on runsc over a layer.
func (c Create) validRestore() error {
	switch {
	case c.FromCheckpoint != "" && !ValidDigest(c.FromCheckpoint):
		return errors.New("from_checkpoint: sha256:<64 lowercase hex>")
	case c.FromMemory != "" && !ValidDigest(c.FromMemory):
		return errors.New("from_memory: sha256:<64 lowercase hex>")
	case c.FromMemory != "" && c.FromCheckpoint == "":
		return errors.New("from_memory: only with from_checkpoint")
	case c.FromMemory != "" && c.Runtime != RuntimeRunsc:
		return errors.New("from_memory: memory checkpoints need runsc")
	case c.Warm && c.FromCheckpoint != "":
		return errors.New("from_checkpoint: a warm sandbox is never a restore")
	}
	return nil
}

// Checkpoint is the payload of sandbox.checkpoint: capture the sandbox's
// writable layer, and with Memory (runsc only) its processes' memory, into
// the object store. The sandbox keeps running.
type Checkpoint struct {
	SandboxID string `json:"sandbox_id"`
	Memory    bool   `json:"memory,omitempty"`
}

// Validate checks a checkpoint payload.
func (c Checkpoint) Validate() error { return ValidSandboxID(c.SandboxID) }

// CheckpointResult is what a host answers to sandbox.checkpoint: the
// content addresses and sizes of what it stored. Memory fields are set
// only for a memory checkpoint.
type CheckpointResult struct {
	Digest       string `json:"digest"`
	Size         int64  `json:"size"`
	MemoryDigest string `json:"memory_digest,omitempty"`
	MemorySize   int64  `json:"memory_size,omitempty"`
}

// Validate checks a host's answer before the control plane records it.
func (r CheckpointResult) Validate() error {
	switch {
	case !ValidDigest(r.Digest) || r.Size <= 0:
		return errors.New("checkpoint result: digest and size required")
	case r.MemoryDigest != "" && (!ValidDigest(r.MemoryDigest) || r.MemorySize <= 0):
		return errors.New("checkpoint result: memory digest and size")
	case r.MemoryDigest == "" && r.MemorySize != 0:
		return errors.New("checkpoint result: memory size without digest")
	}
	return nil
}

// ReasonMemoryNeedsRunsc is a host's refusal of a memory checkpoint of a
// sandbox that does not run on runsc.
const ReasonMemoryNeedsRunsc = "memory-checkpoint-needs-runsc"

// Exec is the payload of sandbox.exec. EnvRefs, set when the sandbox's
// env holds sealed values or secret references, names what the host may
// fetch through the broker for this exec when it no longer holds those
// values (after a bcd restart): the sandbox's env key reference
// (EnvKeyRef) and its secret references. Such an exec works for the
// sandbox's tenant (a subject command), as its create or claim did.
type Exec struct {
	SandboxID string   `json:"sandbox_id"`
	Argv      []string `json:"argv"`
	TimeoutMS int64    `json:"timeout_ms"`
	EnvRefs   []string `json:"env_refs,omitempty"`
}

// MaxExecTimeoutMS bounds one exec.
const MaxExecTimeoutMS = 10 * 60 * 1000

// Validate checks an exec payload.
func (e Exec) Validate() error {
	if err := ValidSandboxID(e.SandboxID); err != nil {
		return err
	}
	if len(e.Argv) == 0 || len(e.Argv) > MaxArgs {
		return fmt.Errorf("argv: 1 to %d arguments", MaxArgs)
	}
	n := 0
	for _, a := range e.Argv {
		n += len(a)
		if strings.IndexByte(a, 0) >= 0 {
			return errors.New("argv: NUL byte")
		}
	}
	if n > MaxArgBytes {
		return errors.New("argv: too long")
	}
	if e.Argv[0] == "" {
		return errors.New("argv: empty program")
	}
	if e.TimeoutMS < 1 || e.TimeoutMS > MaxExecTimeoutMS {
		return errors.New("timeout_ms: between 1 and 600000")
	}
	if len(e.EnvRefs) > MaxEnv+1 {
		return errors.New("env_refs: too many")
	}
	for _, r := range e.EnvRefs {
		_, _, secret := SecretRef(r)
		_, sbx, key := ParseEnvKeyRef(r)
		if !secret && (!key || sbx != e.SandboxID) {
			return errors.New("env_refs: a secret reference or this sandbox's env key")
		}
	}
	return nil
}

// Update is the payload of sandbox.update: a new deadline (extend), and
// for a warm sandbox being claimed, the tenant's environment.
type Update struct {
	SandboxID  string            `json:"sandbox_id"`
	DeadlineMS int64             `json:"deadline_ms"`
	Claim      bool              `json:"claim"`
	Env        map[string]string `json:"env,omitempty"`
}

// Validate checks an update payload.
func (u Update) Validate() error {
	if err := ValidSandboxID(u.SandboxID); err != nil {
		return err
	}
	if u.DeadlineMS <= 0 {
		return errors.New("deadline_ms: required")
	}
	if !u.Claim && len(u.Env) > 0 {
		return errors.New("env: only at claim")
	}
	return validEnv(u.Env, true)
}

// Delete is the payload of sandbox.delete.
type Delete struct {
	SandboxID string `json:"sandbox_id"`
}

// ExecResult is what sandbox.exec returns (the command's result).
type ExecResult struct {
	ExitCode        int    `json:"exit_code"`
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	TimedOut        bool   `json:"timed_out"`
}

var (
	idRE     = regexp.MustCompile(`^sbx[a-z2-7]{16}$`)
	digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
)

// ValidSandboxID checks a sandbox id (ids.New("sbx")): it names files and
// cgroups on the host, so nothing else passes.
func ValidSandboxID(id string) error {
	if !idRE.MatchString(id) {
		return errors.New("sandbox_id: not a sandbox id")
	}
	return nil
}

// ValidDigest reports whether d is sha256:<64 lowercase hex>.
func ValidDigest(d string) bool { return digestRE.MatchString(d) }

// ValidEnv checks environment names and values (a template's: each value
// at most 4096 bytes).
func ValidEnv(env map[string]string) error { return validEnv(env, false) }

// validEnv is ValidEnv; signed (a payload's env) also takes sealed values
// up to maxSealedValue (a 4096-byte value sealed).
func validEnv(env map[string]string, signed bool) error {
	if len(env) > MaxEnv {
		return fmt.Errorf("env: at most %d variables", MaxEnv)
	}
	for k, v := range env {
		if !envKeyRE.MatchString(k) {
			return fmt.Errorf("env: bad name %q", k)
		}
		limit := 4096
		if signed && strings.HasPrefix(v, SealedEnvPrefix) {
			limit = maxSealedValue
		}
		if len(v) > limit || strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("env %s: value too long or holds NUL", k)
		}
	}
	return nil
}

// SecretRefPrefix starts an env value that names a secret
// (secret://TENANT/NAME): the signed spec carries the reference, and the
// host resolves it through the secrets broker for the command that
// carries it; the value reaches only the sandbox's processes.
const SecretRefPrefix = "secret://"

var secretNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// SecretRef splits an env value that is exactly a secret reference into
// its tenant and name; ok is false for any other value.
func SecretRef(v string) (tenant, name string, ok bool) {
	rest, ok := strings.CutPrefix(v, SecretRefPrefix)
	if !ok {
		return "", "", false
	}
	tenant, name, ok = strings.Cut(rest, "/")
	if !ok || tenant == "" || len(tenant) > 64 || !secretNameRE.MatchString(name) {
		return "", "", false
	}
	return tenant, name, true
}

// CheckSecretEnv refuses an env value that mentions a secret reference
// (secret://, in any case) without being exactly one: a reference is
// resolved only as a whole value.
func CheckSecretEnv(env map[string]string) error {
	for k, v := range env {
		if strings.Contains(strings.ToLower(k), SecretRefPrefix) {
			return fmt.Errorf("env: a name may not hold a secret reference")
		}
		if _, _, ok := SecretRef(v); !ok && strings.Contains(strings.ToLower(v), SecretRefPrefix) {
			return fmt.Errorf("env %s: a value naming a secret must be exactly secret://TENANT/NAME", k)
		}
	}
	return nil
}
