package nodes

import (
	"crypto/subtle"
	"time"

	"github.com/bettercompute/bettercompute/internal/jointoken"
)

// The pure decisions of the module: no database, no clock (now is passed
// in). The methods read rows, call one of these, then write.

// Join refusal reasons, recorded in security.join.refused.
const (
	reasonTokenMalformed   = "token-malformed"
	reasonTokenPinMismatch = "token-pin-mismatch"
	reasonNameInvalid      = "name-invalid"
	reasonTokenUnknown     = "token-unknown"
	reasonTokenUsed        = "token-used"
	reasonTokenExpired     = "token-expired"
	reasonCSRInvalid       = "csr-invalid"
)

// checkJoinRequest checks what a joining node sent before anything is
// read: a well-formed token for this deployment's join key (pin) and an
// acceptable name. It returns the parsed token, and the refusal reason
// ("" to go on); parsed is false when the token did not parse.
func checkJoinRequest(token string, pins [][32]byte, name string) (t jointoken.Token, parsed bool, reason string) {
	t, err := jointoken.Parse(token)
	if err != nil {
		return jointoken.Token{}, false, reasonTokenMalformed
	}
	pinned := 0
	for _, pin := range pins {
		pinned |= subtle.ConstantTimeCompare(t.Pin[:], pin[:])
	}
	if pinned != 1 {
		return t, true, reasonTokenPinMismatch
	}
	if name != "" && !ValidateName(name) {
		// The name is shown to operators; one that could carry terminal
		// controls or pass for another node is refused, token unspent.
		return t, true, reasonNameInvalid
	}
	return t, true, ""
}

// decideJoin decides whether the stored token row (found false: no row)
// admits a join with secret at now: "" admits, otherwise the refusal
// reason.
func decideJoin(row tokenRow, found bool, secret string, now time.Time) string {
	switch {
	case !found:
		return reasonTokenUnknown
	case subtle.ConstantTimeCompare(row.hash, jointoken.HashSecret(secret)) != 1:
		return reasonTokenUnknown
	case row.used.Valid:
		return reasonTokenUsed
	case now.UnixMilli() >= row.expires:
		return reasonTokenExpired
	}
	return ""
}

// joinName is the name a joining node gets: the one it asked for, else
// the token's, else its id.
func joinName(asked, token, nodeID string) string {
	switch {
	case asked != "":
		return asked
	case token != "":
		return token
	}
	return nodeID
}

// sessionDecision is what a Hello does to the node's previous session.
type sessionDecision struct {
	// Superseded is the previous session's id when it was not closed.
	Superseded string
	// Moved means that session was held by another gateway, which must
	// be told to close it.
	Moved bool
	// Flip means the previous session was live and from another boot: an
	// alternation of the node's identity between two machines.
	Flip bool
}

// decideSession decides what a Hello from bootID on gatewayID at now does
// to prev, the node's session row (found false: none). A session whose
// heartbeat is older than SessionQuietAfter went quiet: it is superseded
// without counting a flip.
func decideSession(prev sessionRow, found bool, bootID, gatewayID string, now time.Time) sessionDecision {
	open := found && !prev.closed.Valid
	if !open {
		return sessionDecision{}
	}
	beat := prev.connected
	if prev.heartbeat.Valid {
		beat = prev.heartbeat.Int64
	}
	live := beat >= now.Add(-SessionQuietAfter).UnixMilli()
	return sessionDecision{Superseded: prev.session, Moved: prev.gateway != gatewayID, Flip: live && prev.boot != bootID}
}

// flipWindowStart is the start of the window flips are counted in.
func flipWindowStart(now time.Time) time.Time { return now.Add(-FlipWindow) }

// quarantines reports whether count flips within FlipWindow quarantine a
// node: more than FlipLimit.
func quarantines(count int) bool { return count > FlipLimit }

// Renewal refusal reasons decided under the node's lock.
const (
	reasonRenewRevoked     = "certificate-revoked"
	reasonRenewRateLimited = "renew-rate-limited"
)

// decideRenew decides a renewal under the node's lock: the presenting
// certificate revoked since it was first read refuses it, and so does any
// renewal of the node within the interval (recent counts them); "" admits.
func decideRenew(revoked bool, recent int) string {
	switch {
	case revoked:
		return reasonRenewRevoked
	case recent > 0:
		return reasonRenewRateLimited
	}
	return ""
}

// renewWindowStart is the start of the window in which an earlier renewal
// of the node rate-limits a new one.
func renewWindowStart(now time.Time, interval time.Duration) time.Time { return now.Add(-interval) }
