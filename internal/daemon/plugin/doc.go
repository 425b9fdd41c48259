// Package plugin runs bcx driver plugins out of process and confined, so a
// driver bcd did not compile in never runs with bcd's own privileges.
//
// A plugin is a binary pinned by SHA-256. bcd opens it without following a
// symlink, hashes it through the open descriptor and executes that same
// descriptor through its own __bcx-exec shim (ShimMain), never the path
// again, so swapping the file after the check runs nothing else. The shim
// starts in the plugin's own process group, under the plugin's own uid and
// gid when bcd is root (AssignIDs), waits until bcd has put it into the
// plugin's cgroups (Cgroups), then sets no_new_privs, installs a seccomp
// filter on every thread (Filter) and executes the plugin.
//
// The plugin speaks newline-delimited JSON on its standard input and
// output (wire.go): a bounded handshake naming it and its inventory, then
// requests and responses by id, each line bounded. Plugin implements
// driver.Driver over that protocol; Serve is the plugin's side, with which
// `bcd driver-plugin sim` serves the sim driver.
package plugin

import "errors"

// Refusal codes. Every refusal of this package is an *Error carrying one
// of them, so callers and tests tell refusals apart by code, not by text.
const (
	CodeNameInvalid       = "plugin-name-invalid"
	CodeOpen              = "plugin-open-refused"
	CodeNotRegular        = "plugin-not-regular"
	CodeHashMismatch      = "plugin-hash-mismatch"
	CodeWritable          = "plugin-writable"
	CodeUserRoot          = "plugin-user-root"
	CodeIDsExhausted      = "plugin-ids-exhausted"
	CodeCgroup            = "plugin-cgroup"
	CodeStart             = "plugin-start"
	CodeHandshakeTimeout  = "plugin-handshake-timeout"
	CodeHandshakeTooLarge = "plugin-handshake-too-large"
	CodeHandshakeInvalid  = "plugin-handshake-invalid"
	CodeMessageTooLarge   = "plugin-message-too-large"
	CodeMessageInvalid    = "plugin-message-invalid"
	CodePayloadInvalid    = "payload-invalid"
	CodeExited            = "plugin-exited"
	CodeClosed            = "plugin-closed"
	CodeShim              = "plugin-shim"
)

// Error is a refusal with its code; Err, when set, is the underlying cause
// (never a secret: plugin paths and hashes are configuration, not secrets).
type Error struct {
	Code string
	Err  error
}

// Error returns the code, then the cause.
func (e *Error) Error() string {
	if e.Err == nil {
		return e.Code
	}
	return e.Code + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// CodeOf returns the code of the first *Error in err's chain, or "".
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func refuse(code string, err error) error { return &Error{Code: code, Err: err} }
