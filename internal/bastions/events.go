package bastions

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"unicode/utf8"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// MaxLaneEvents is the most lane events one RecordLaneEvents call takes.
const MaxLaneEvents = 256

// Reasons a batch of lane events is refused (INVALID_INPUT; nothing of the
// batch is written).
const (
	ReasonEventsTooMany = "lane-events-too-many" // over MaxLaneEvents in one call
	ReasonEventKind     = "lane-event-kind"      // a kind that is not [a-z.-]{1,32}
	ReasonEventField    = "lane-event-field"     // a lane, reason, peer or hash of the wrong shape
)

// LaneEvent is one entry of a bastion's on-machine audit chain, forwarded
// while it is connected: every accept and refusal of a lane connection.
type LaneEvent struct {
	Seq    uint64 // its position in the bastion's chain
	Kind   string // "accept", "refuse", … ([a-z.-]{1,32})
	Lane   string // e.g. "inference/ollama", "service/db", "egress"
	Reason string // a refusal's reason code
	Peer   string // the remote address as the bastion saw it in the tunnel
	Hash   string // the chain entry's hash (hex SHA-256)
}

var (
	eventKindRE   = regexp.MustCompile(`^[a-z.-]{1,32}$`)
	eventLaneRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9/._-]{0,79}$`) // service/ and a 63-byte name fit
	eventReasonRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	eventPeerRE   = regexp.MustCompile(`^[0-9a-fA-F:.\[\]%a-z]{1,64}$`)
	eventHashRE   = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// CheckLaneEvents decides a batch of lane events from a bastion: at most
// MaxLaneEvents, each kind a token, each other field empty or of its
// shape. It is pure; it returns the first fault as a Refusal.
func CheckLaneEvents(evs []LaneEvent) error {
	if len(evs) > MaxLaneEvents {
		return refuse(errs.InvalidInput, ReasonEventsTooMany, fmt.Sprintf("at most %d events per call", MaxLaneEvents))
	}
	for i, e := range evs {
		if !eventKindRE.MatchString(e.Kind) {
			return refuse(errs.InvalidInput, ReasonEventKind, fmt.Sprintf("event %d", i))
		}
		for _, f := range []struct {
			v  string
			re *regexp.Regexp
		}{{e.Lane, eventLaneRE}, {e.Reason, eventReasonRE}, {e.Peer, eventPeerRE}, {e.Hash, eventHashRE}} {
			if f.v != "" && (!utf8.ValidString(f.v) || !f.re.MatchString(f.v)) {
				return refuse(errs.InvalidInput, ReasonEventField, fmt.Sprintf("event %d", i))
			}
		}
	}
	return nil
}

// laneOutcome is the audit outcome of a lane event: refused for a refusal
// (kind "refuse" or any event carrying a reason), allowed otherwise.
func laneOutcome(e LaneEvent) string {
	if e.Kind == "refuse" || e.Reason != "" {
		return "refused"
	}
	return "allowed"
}

// RecordLaneEvents writes bastionID's lane events to the audit log in the
// bastion's tenant, in one transaction: action compute:bastions:lane.<kind>,
// resource bastion/<id>, outcome allowed or refused, details {lane, reason,
// peer, seq, hash}. A batch with any bad event is refused whole
// (INVALID_INPUT with a Reason); a node that is not a bastion is refused
// (ACCESS_DENIED). An unpaired bastion's last events are still recorded:
// they are evidence of what it did.
func (s *Service) RecordLaneEvents(ctx context.Context, bastionID string, evs []LaneEvent) error {
	if err := CheckLaneEvents(evs); err != nil {
		return err
	}
	tenant, err := s.bastionNode(ctx, bastionID, errs.AccessDenied)
	if err != nil {
		return err
	}
	if len(evs) == 0 {
		return nil
	}
	entries := make([]audit.Entry, len(evs))
	for i, e := range evs {
		entries[i] = audit.Entry{TenantID: tenant, Actor: "node/" + bastionID, Action: "compute:bastions:lane." + e.Kind,
			Resource: "bastion/" + bastionID, Outcome: laneOutcome(e),
			Details: map[string]any{"lane": e.Lane, "reason": e.Reason, "peer": e.Peer, "seq": e.Seq, "hash": e.Hash}}
	}
	return s.db.Tx(ctx, func(tx *sql.Tx) error {
		return audit.RecordMany(ctx, tx, s.db.Dialect, s.clk.Now(), entries)
	})
}
