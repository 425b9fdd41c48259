package mcpgate

import (
	"encoding/json"
	"strings"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/kinds"
)

// The id prefixes the gate's tools take (internal/ids.New).
const (
	prefixNode       = "n"
	prefixSandbox    = "sbx"
	prefixCheckpoint = "ckp"
	prefixTemplate   = "tpl"
	prefixTenant     = "t"
	prefixEvent      = "ev_"
)

// badID is the refusal of an id that is not well-formed; the id itself is
// not repeated (it is the agent's text).
func badID(field, what string) error {
	return errs.New(errs.InvalidInput, field+": not a well-formed "+what+" id")
}

// checkID refuses s unless it is an id made with prefix.
func checkID(field, what, prefix, s string) error {
	if !ids.Valid(prefix, s) {
		return badID(field, what)
	}
	return nil
}

// checkTenant refuses a tenant id that is neither empty (the caller's
// own tenant, which is how the root tenant's own agent names root) nor a
// well-formed tenant id.
func checkTenant(s string) error {
	if s == "" || ids.Valid(prefixTenant, s) {
		return nil
	}
	return badID("tenant_id", "tenant")
}

// checkTemplate refuses a template that is neither a template id nor a
// valid name.
func checkTemplate(s string) error {
	if ids.Valid(prefixTemplate, s) || ids.ValidName(s) {
		return nil
	}
	return errs.New(errs.InvalidInput, "template: neither a well-formed template id nor a valid name")
}

// checkKind refuses, before anything is sent, a kind that is unknown, one
// a module makes through its own method (sandbox.*, ssh.*: the SSH access
// kind carries keys), and every destructive kind: the gate runs only
// non-destructive commands.
func checkKind(kind string) error {
	switch {
	case !kinds.Known(kind):
		return errs.New(errs.InvalidInput, "kind: not a command kind this release defines")
	case kinds.Destructive(kind):
		return errs.New(errs.AccessDenied, "kind: destructive kinds are not run through the MCP gate")
	case kinds.Owner(kind) != "":
		return errs.New(errs.InvalidInput, "kind: made by its module's own method, not by a command")
	}
	return nil
}

// sshMarkers are text that only SSH key material carries: public key
// types (authorized_keys lines, certificates), private key armour, and
// the base64 openings of a bare public key blob (its type's length and
// name, as a key written without its type word starts).
var sshMarkers = []string{
	"ssh-rsa", "ssh-dss", "ssh-ed25519", "ssh-ed448", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-",
	"-cert-v01@openssh.com", "OPENSSH PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY",
	"DSA PRIVATE KEY", "BEGIN PRIVATE KEY", "ENCRYPTED PRIVATE KEY", "SSH2 PUBLIC KEY", "SSH2 ENCRYPTED PRIVATE KEY",
	"AAAAC3NzaC1lZDI1NTE5", "AAAAB3NzaC1y", "AAAAB3NzaC1k", "AAAAE2VjZHNhLXNoYTItbmlzdHA", "AAAAGnNrLXNzaC1lZDI1NTE5",
	"AAAAInNrLWVjZHNh", "AAAACXNzaC1lZDQ0",
}

// hasSSHKey reports whether s carries SSH key material.
func hasSSHKey(s string) bool {
	for _, m := range sshMarkers {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// errSSHKey refuses an input that carries SSH key material.
var errSSHKey = errs.New(errs.InvalidInput, "no MCP tool takes SSH keys: the input carries SSH key material")

// checkNoSSHKey refuses any of texts that carries SSH key material.
func checkNoSSHKey(texts ...string) error {
	for _, t := range texts {
		if hasSSHKey(t) {
			return errSSHKey
		}
	}
	return nil
}

// sshFieldNames name answer fields that carry SSH keys or certificates.
var sshFieldNames = []string{"ssh", "authorized_key", "host_key", "public_key", "private_key"}

// sshField reports whether an answer's field name carries SSH keys.
func sshField(name string) bool {
	n := strings.ToLower(name)
	for _, f := range sshFieldNames {
		if strings.Contains(n, f) {
			return true
		}
	}
	return false
}

// removedSSH replaces a string of an answer that carried SSH key material.
const removedSSH = "[removed: SSH key material]"

// scrub returns v as plain JSON values with every SSH key field dropped
// and every string carrying SSH key material replaced, so no tool returns
// an SSH key whatever an answer holds.
func scrub(v any) any {
	raw, err := json.Marshal(v)
	if err != nil {
		return map[string]any{"error": "answer could not be encoded"}
	}
	var plain any
	if err := json.Unmarshal(raw, &plain); err != nil {
		return map[string]any{"error": "answer could not be encoded"}
	}
	return scrubValue(plain)
}

func scrubValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if sshField(k) {
				delete(x, k)
				continue
			}
			x[k] = scrubValue(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = scrubValue(e)
		}
		return x
	case string:
		if hasSSHKey(x) {
			return removedSSH
		}
		return x
	}
	return v
}
