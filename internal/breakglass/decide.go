package breakglass

import (
	"slices"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/sshca"
)

// DefaultValidity is a certificate's validity when the request names none,
// and the longest one it may name.
const DefaultValidity = sshca.MaxValidity

// ReasonValidityInvalid refuses a validity outside 1 s to 1 h.
const ReasonValidityInvalid = "ssh-validity-invalid"

// ReasonNodeRole refuses a node whose certificate role does not run
// ssh.access (only role node does).
const ReasonNodeRole = "ssh-node-role"

// ReasonSerialInvalid refuses a serial that is not a decimal from 1 to
// 2^63-1.
const ReasonSerialInvalid = "ssh-serial-invalid"

// ReasonSerialUnknown refuses a revocation of a serial not issued for the
// node.
const ReasonSerialUnknown = "ssh-serial-unknown"

// notAfter decides the end of a certificate's validity: now plus the
// requested seconds (0: DefaultValidity; more than an hour or negative is
// refused), never past the caller's credential (zero: none). sshca.Issue
// applies it and its own 1 h bound again.
func notAfter(now time.Time, validitySeconds int64, credential time.Time) (time.Time, error) {
	if validitySeconds < 0 || validitySeconds > int64(DefaultValidity/time.Second) {
		return time.Time{}, errs.New(errs.InvalidInput, ReasonValidityInvalid+": validity_seconds must be 1 to 3600 (0: 3600)")
	}
	d := DefaultValidity
	if validitySeconds > 0 {
		d = time.Duration(validitySeconds) * time.Second
	}
	end := now.Add(d)
	if !credential.IsZero() && credential.Before(end) {
		end = credential
	}
	return end, nil
}

// needsDelivery decides whether a new state must be queued to the node:
// always when none was queued before (the CA must reach it), when the
// accounts differ from the last queued state's, and after every
// revocation (revoked).
func needsDelivery(last *sshca.Access, accounts []string, revoked bool) bool {
	return last == nil || revoked || !slices.Equal(last.Accounts, accounts)
}
