// Package approval keeps the bastion's on-machine approvals: the second
// factor enrolled here (RFC 6238 TOTP), one-use approvals bound to an op and
// a digest of its arguments, the lockout after repeated refused writes, the
// standing grants in ops.json, the root command grant and the anchor mark.
//
// Why on the machine: the control plane asks, but only the person at the
// machine can answer, by entering a code from the factor enrolled here. So
// everything lives in the bastion's data folder (0700, files 0600, written
// whole with internal/atomicfile) and is re-read on every call, since two
// processes use it at once (`bcd bastion run` and `bcd bastion approve`).
// Every read-modify-write holds an exclusive flock on DIR/approval.lock.
//
// Every file is sealed (AES-256-GCM) with a key derived by HKDF-SHA256 from
// the bastion's own key bytes (given by the caller, never stored here) and
// a per-file purpose, and its additional data binds the bastion id (and,
// for a standing grant, the grant id). A file edited by hand, copied from
// another bastion, or a sealed blob moved to another name or record does
// not open, and holds nothing: no factor, no approval, no grant.
//
// What the seal does not stop: the bastion's own account can read the key,
// so it can write new records or put back an older sealed copy of the same
// file or record (fewer runs logged, an earlier last-used code step, a
// revoked root grant). That account is root on a networked install, and
// root on the machine is outside what this package defends.
package approval
