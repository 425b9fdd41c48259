// Package kinds is the table of command kinds: which certificate role may
// run which kind, and which kinds are destructive. Both the control plane and
// bcd read it; bcd enforces it against its own certificate's role, so a
// control plane that sends a kind a role does not allow is refused on the
// machine (kind-not-allowed).
package kinds

import (
	"slices"
	"strings"

	"github.com/bettercompute/bettercompute/internal/pki"
)

// The command kinds this release defines.
const (
	NodePing   = "node.ping"
	DiagRun    = "diag.run"
	NodeReboot = "node.reboot"
	DiskWipe   = "disk.wipe"
	// SecretDigest fetches a secret through the broker and returns only its
	// SHA-256: the end-to-end proof of the secret path.
	SecretDigest = "secret.digest"
	// The sandbox kinds (package sandboxes): each payload is the whole
	// signed spec the host enforces (internal/sandboxes/spec).
	SandboxCreate = "sandbox.create"
	SandboxExec   = "sandbox.exec"
	SandboxUpdate = "sandbox.update"
	SandboxDelete = "sandbox.delete"
	// SandboxCheckpoint captures a sandbox's writable layer (and, on
	// runsc with memory set, its processes' memory) into the object
	// store and answers the content addresses (spec.CheckpointResult).
	SandboxCheckpoint = "sandbox.checkpoint"
	// SSHAccess writes a node's break-glass sshd files (package breakglass
	// makes it; payload sshca.Access: the CA, the accounts, the revoked
	// serials and a generation the node never goes back from).
	SSHAccess = "ssh.access"
	// GPUReset resets one GPU of the machine's own inventory (payload
	// {"gpu":"<id>"}); destructive: it kills whatever runs on that GPU.
	GPUReset = "gpu.reset"
)

// byRole lists the kinds each certificate role accepts.
var byRole = map[string][]string{
	pki.RoleNode:       {NodePing, DiagRun, NodeReboot, DiskWipe, SecretDigest, SandboxCreate, SandboxExec, SandboxUpdate, SandboxDelete, SandboxCheckpoint, SSHAccess, GPUReset},
	pki.RoleRamdisk:    {NodePing, DiagRun, DiskWipe},
	pki.RoleSite:       {NodePing},
	pki.RoleNodeTenant: {NodePing, DiagRun},
	// A bastion is a person's own machine: the control plane never runs a
	// command on it (its lanes are decided by signed grants instead).
	pki.RoleBastion: {},
}

// Modules that own command kinds. A kind a module owns is created only by
// that module, after its own authorization decision; the generic command
// path (commands.create, commands.fanout, commands.createInBatch) refuses
// it, so a caller refused the module's method cannot reach the same effect
// through a raw command.
const (
	ModuleSandboxes  = "sandboxes"
	ModuleBreakGlass = "breakglass"
)

// owners maps a kind prefix to the module that owns every kind under it.
// A new module that brings kinds of its own adds a row here.
var owners = []struct{ prefix, module string }{
	{"sandbox.", ModuleSandboxes},
	{"ssh.", ModuleBreakGlass},
}

// Owner returns the module that owns kind, or "" when the kind belongs to
// the generic command path.
func Owner(kind string) string {
	for _, o := range owners {
		if strings.HasPrefix(kind, o.prefix) {
			return o.module
		}
	}
	return ""
}

// destructive kinds change or destroy a machine's state.
var destructive = []string{NodeReboot, DiskWipe, GPUReset}

// Known reports whether kind is defined at all.
func Known(kind string) bool {
	for _, ks := range byRole {
		if slices.Contains(ks, kind) {
			return true
		}
	}
	return false
}

// AllowedForRole reports whether a certificate of role may run kind.
// An unknown role allows nothing.
func AllowedForRole(role, kind string) bool {
	return slices.Contains(byRole[role], kind)
}

// Permitted reports whether a certificate of role, narrowed to allowed
// (nil: no narrowing), may run kind. bcd and the gateway's Hello check
// both use it.
func Permitted(role string, allowed []string, kind string) bool {
	return AllowedForRole(role, kind) && (allowed == nil || slices.Contains(allowed, kind))
}

// ForRole returns a copy of the kinds role allows.
func ForRole(role string) []string { return slices.Clone(byRole[role]) }

// Destructive reports whether kind is destructive (any bmc.* kind is).
func Destructive(kind string) bool {
	return slices.Contains(destructive, kind) || len(kind) > 4 && kind[:4] == "bmc." || kind == "site.httpProxy"
}
