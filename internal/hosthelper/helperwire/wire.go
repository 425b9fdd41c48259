// Package helperwire is the wire contract between the unprivileged node
// agent (bcd node) and the root helper (bcd helper): one versioned JSON
// Request per Unix-socket connection, the caller then shuts its write half,
// and one JSON Response comes back. The helper trusts nothing in a request:
// operations are typed (a file is named by kind and id, a sandbox by its id
// and a signed command), never a path or an argv the node chooses, and
// every operation that changes the host carries the node's signed desired
// state, which the helper verifies under roots it pins itself.
//
// This package holds only the shapes and the refusal codes, so the node,
// the helper and the tests agree on them; the server is internal/hosthelper.
package helperwire

import (
	"encoding/json"
	"fmt"
)

// Version is the one request and response version spoken. A helper and a
// node of different versions fail closed: the helper refuses any other
// version with CodeVersion.
const Version = 1

// Size bounds. A request is at most MaxRequest bytes (the helper reads one
// byte more to tell), a response at most MaxResponse.
const (
	MaxRequest  = 4 << 20
	MaxResponse = 16 << 20
)

// Operations.
const (
	// OpPing answers the helper's version and the caller it saw; changes
	// nothing, carries no intent.
	OpPing = "ping"
	// OpFileWrite writes a file named by kind and id (FileWrite).
	OpFileWrite = "file.write"
	// OpFileRemove removes a file named by kind and id (FileRef).
	OpFileRemove = "file.remove"
	// OpFirewallApply applies an nftables ruleset confined to bcd's own
	// tables (FirewallApply).
	OpFirewallApply = "firewall.apply"
	// OpGPUReset resets one GPU of the host's own inventory (GPUReset).
	OpGPUReset = "gpu.reset"
	// OpReboot reboots the host (Reboot).
	OpReboot = "host.reboot"
	// OpSandboxCreate, OpSandboxExec, OpSandboxUpdate and OpSandboxDelete
	// run a sandbox.* command as root: Request.Command carries the signed
	// command the control plane sent, which the helper verifies itself
	// (signer chained to its pinned roots, this node, fresh, not replayed,
	// kind allowed by the signed desired state). The sandbox id comes from
	// the signed payload, never from Args.
	OpSandboxCreate = "sandbox.create"
	OpSandboxExec   = "sandbox.exec"
	OpSandboxUpdate = "sandbox.update"
	OpSandboxDelete = "sandbox.delete"
	// OpSandboxCheckpoint runs a signed sandbox.checkpoint command as
	// root, verified like the four above.
	OpSandboxCheckpoint = "sandbox.checkpoint"
	// OpSandboxLabels answers the helper's sandbox host's capability
	// labels (SandboxLabels), which the node advertises in Hello. Read
	// only; carries no intent.
	OpSandboxLabels = "sandbox.labels"
	// OpSandboxFailures answers the sandboxes the helper's sweep found
	// dead and removed and that have not been deleted since
	// (SandboxFailures). Read only and level-triggered: the same list
	// comes back on every call until a sandbox.delete clears an entry,
	// so a node that restarts learns them again (the control plane takes
	// a repeated report as a no-op).
	OpSandboxFailures = "sandbox.failures"
	// OpSandboxAdopt has the helper's sandbox host adopt what it found
	// running when it opened: the first call checks each sandbox against
	// the signed commands its state keeps, verified under the helper's
	// own trust (the roots it holds and the desired state the request
	// carries, never the node's word), and kills the ones that do not
	// match (then listed by OpSandboxFailures, spec-unmatched). Every call
	// answers the adopted sandboxes the host still holds
	// (SandboxAdopted), so a node that restarts reports them again. It
	// changes the host, so it carries intent.
	OpSandboxAdopt = "sandbox.adopt"
	// OpSSHAccess applies a break-glass ssh.access state: Request.Command
	// carries the signed ssh.access command the control plane sent, which
	// the helper verifies like a sandbox command; it then renders and
	// writes the sshd files itself (CA, KRL, principals) by kind and id.
	// The node never sends file content.
	OpSSHAccess = "ssh.access"
	// OpEventsDrain returns and forgets the helper's recent events
	// (operations done and callers refused), so the node can send them to
	// the control plane as audit rows. Changes nothing on the host.
	OpEventsDrain = "events.drain"
)

// Request is one call. Intent, Bundle and Command are marshalled protobuf
// messages (base64 in JSON).
type Request struct {
	Version int    `json:"version"`
	Op      string `json:"op"`
	// Intent is a marshalled nodev1.SignedDesiredState: the last desired
	// state the node verified. Required on every operation that changes
	// the host once the helper holds command-signing roots.
	Intent []byte `json:"intent,omitempty"`
	// Bundle is a marshalled nodev1.SignedTrustBundle the node holds; the
	// helper checks it against its own join-key pin and takes its command
	// roots only when it is newer than the one it accepted (forward only).
	Bundle []byte `json:"bundle,omitempty"`
	// Command is a marshalled nodev1.SignedCommand, for sandbox.*.
	Command []byte `json:"command,omitempty"`
	// Args are the operation's own arguments (FileWrite, FileRef, ...).
	Args json.RawMessage `json:"args,omitempty"`
	// EnvValues are what the node fetched through the secrets broker for
	// Command (a sandbox's secret references and env key, by reference):
	// the helper's host resolves the command's env from them as an
	// in-process host does through the broker. Never logged or written.
	EnvValues map[string][]byte `json:"env_values,omitempty"`
}

// Response is the helper's answer: Code is empty when the operation was
// done, else a refusal code (Code*) with a safe Reason.
type Response struct {
	Version int             `json:"version"`
	Code    string          `json:"code,omitempty"`
	Reason  string          `json:"reason,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
}

// Refusal codes. They are part of the contract: tests and operators match
// on them.
const (
	CodePeerUID         = "peer-uid"          // caller's uid/gid is neither the node account's nor root's
	CodePeerExe         = "peer-exe"          // caller's /proc/<pid>/exe is not an installed bcd
	CodeTooLarge        = "request-too-large" // over MaxRequest
	CodeMalformed       = "request-malformed" // not one strict JSON object (unknown field, trailing byte, ...)
	CodeVersion         = "version-unsupported"
	CodeUnknownOp       = "op-unknown"
	CodeArgs            = "args-invalid"     // the operation's arguments do not decode or are out of bounds
	CodeFileKind        = "file-kind"        // kind not in the helper's table
	CodeFileID          = "file-id"          // id empty, too long, or with '/', "..", NUL or another byte outside the id alphabet
	CodePathSymlink     = "path-symlink"     // a symlink at the target or on the way down
	CodePathNotDir      = "path-not-dir"     // something on the way down is not a directory
	CodePathOwner       = "path-owner"       // a directory on the way down is not root's
	CodePathWritable    = "path-writable"    // a directory on the way down is writable by group or other
	CodeFileTooLarge    = "file-too-large"   // over 1 MiB
	CodeRuleset         = "ruleset-refused"  // a ruleset outside bcd's tables, or with include/define/ruleset
	CodeGPUUnknown      = "gpu-unknown"      // not a GPU of the host's own inventory
	CodeIntentMissing   = "intent-missing"   // a host-changing operation without a signed desired state, once roots are held
	CodeIntentMalformed = "intent-malformed" // does not decode
	CodeIntentUntrusted = "intent-untrusted" // signer not chained to the pinned roots, or not a worker
	CodeIntentSignature = "intent-signature" // signature does not verify
	CodeIntentOtherNode = "intent-other-node"
	CodeIntentRewound   = "intent-rewound"  // generation older than one the helper applied
	CodeBundle          = "bundle-refused"  // a trust bundle that does not verify under the join-key pin, or is older
	CodeCommand         = "command-refused" // the signed command did not verify; Reason is the daemon's reason (signer-untrusted, wrong-node, ...)
	CodeFailed          = "failed"          // allowed, but the operation itself failed
)

// Refusal is a refused or failed call, as the client returns it.
type Refusal struct {
	Code   string
	Reason string
}

func (r *Refusal) Error() string {
	if r.Reason == "" {
		return "helper refused: " + r.Code
	}
	return fmt.Sprintf("helper refused: %s: %s", r.Code, r.Reason)
}

// FileWrite is OpFileWrite's arguments.
type FileWrite struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`
	Data []byte `json:"data"`
}

// FileRef is OpFileRemove's arguments.
type FileRef struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`
}

// FirewallApply is OpFirewallApply's arguments: an nft script.
type FirewallApply struct {
	Ruleset string `json:"ruleset"`
}

// GPUReset is OpGPUReset's arguments: a GPU's id in the host inventory.
type GPUReset struct {
	GPU string `json:"gpu"`
}

// Reboot is OpReboot's arguments; the helper cuts Reason to MaxRebootReason
// bytes.
type Reboot struct {
	Reason string `json:"reason"`
}

// MaxRebootReason is the most of a reboot reason the helper keeps.
const MaxRebootReason = 200

// Ping is OpPing's result.
type Ping struct {
	Version int    `json:"version"`
	PID     int32  `json:"pid"`
	UID     uint32 `json:"uid"`
	GID     uint32 `json:"gid"`
}

// Event is one thing the helper did or refused, for the audit log.
type Event struct {
	AtMs   int64  `json:"at_ms"`
	PID    int32  `json:"pid"`
	UID    uint32 `json:"uid"`
	Op     string `json:"op,omitempty"`
	Code   string `json:"code,omitempty"` // empty when done
	Reason string `json:"reason,omitempty"`
}

// Events is OpEventsDrain's result.
type Events struct {
	Events  []Event `json:"events"`
	Dropped int     `json:"dropped"` // events lost because the buffer was full
}

// SandboxLabels is OpSandboxLabels' result.
type SandboxLabels struct {
	Labels map[string]string `json:"labels"`
}

// SandboxFailure is one sandbox the helper found dead and removed.
type SandboxFailure struct {
	SandboxID string `json:"sandbox_id"`
	Reason    string `json:"reason"`
}

// SandboxAdopted is OpSandboxAdopt's result, sorted.
type SandboxAdopted struct {
	SandboxIDs []string `json:"sandbox_ids"`
}

// SandboxFailures is OpSandboxFailures' result, sorted by sandbox id.
type SandboxFailures struct {
	Failures []SandboxFailure `json:"failures"`
	// Dropped counts failures the helper could not keep (its list was
	// full); they are logged in the helper only.
	Dropped int `json:"dropped,omitempty"`
}
