package quorum

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
	"github.com/bettercompute/bettercompute/internal/store"
)

// ApproverSetView is an approver set as the API shows it.
type ApproverSetView struct {
	Deployment string   `json:"deployment"`
	Generation uint64   `json:"generation"`
	Threshold  int      `json:"threshold"`
	Keys       []string `json:"keys"` // base64, ascending
}

func view(deployment string, s quorumwire.ApproverSet) ApproverSetView {
	v := ApproverSetView{Deployment: deployment, Generation: s.Generation, Threshold: s.Threshold, Keys: []string{}}
	for _, k := range s.Keys {
		v.Keys = append(v.Keys, base64.StdEncoding.EncodeToString(k))
	}
	return v
}

// chain reads the recorded approver-set changes and replays them from the
// pinned set, as a node does: a change that does not verify against the
// set before it ends the chain (and is logged), so a row written straight
// into the database cannot move the control plane's idea of the set. It
// returns the set in force and every row as stored.
func (s *Service) chain(ctx context.Context) (quorumwire.ApproverSet, []setRow, error) {
	rows, err := s.db.QueryContext(ctx, sqlApproverSets)
	if err != nil {
		return quorumwire.ApproverSet{}, nil, fmt.Errorf("quorum: read approver sets: %w", err)
	}
	defer rows.Close()
	var all []setRow
	for rows.Next() {
		r, sigErr, err := scanSetRow(rows)
		if err != nil {
			return quorumwire.ApproverSet{}, nil, fmt.Errorf("quorum: scan approver set: %w", err)
		}
		if sigErr != nil {
			s.log.Error("approver set change unreadable", "generation", r.generation, "err", sigErr)
		}
		all = append(all, r)
	}
	if err := rows.Err(); err != nil {
		return quorumwire.ApproverSet{}, nil, fmt.Errorf("quorum: read approver sets: %w", err)
	}
	cur, broken, err := replayChain(s.pinned, s.deployment, all)
	if broken >= 0 {
		s.log.Error("approver set change does not verify", "generation", all[broken].generation, "err", err)
	}
	return cur, all, nil
}

// Current returns the approver set in force: the pinned set, moved forward
// by every recorded change that its predecessor's quorum signed.
func (s *Service) Current(ctx context.Context) (quorumwire.ApproverSet, error) {
	cur, _, err := s.chain(ctx)
	return cur, err
}

// CurrentView is Current for the API.
func (s *Service) CurrentView(ctx context.Context) (ApproverSetView, error) {
	cur, err := s.Current(ctx)
	if err != nil {
		return ApproverSetView{}, err
	}
	return view(s.deployment, cur), nil
}

// Chain returns the recorded approver-set changes, oldest first, exactly as
// stored: nodes receive them in Welcome and check each one against the set
// they hold, so the control plane does not filter what it relays.
func (s *Service) Chain(ctx context.Context) ([]*nodev1.SignedApproverSet, error) {
	_, rows, err := s.chain(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*nodev1.SignedApproverSet, 0, len(rows))
	for _, r := range rows {
		m := &nodev1.SignedApproverSet{Deployment: s.deployment, Generation: r.generation, Threshold: uint32(r.threshold), Keys: r.keys}
		for _, sg := range r.sigs {
			m.Signatures = append(m.Signatures, &nodev1.ApproverSignature{PublicKey: sg.PublicKey, Signature: sg.Signature})
		}
		out = append(out, m)
	}
	return out, nil
}

// SetChangeStatus reports a proposed approver-set change after a signature.
type SetChangeStatus struct {
	Proposed ApproverSetView `json:"proposed"`
	Signed   int             `json:"signed"`   // valid signatures by current approvers
	Needed   int             `json:"needed"`   // the current threshold
	Applied  bool            `json:"applied"`  // the change is now the current set
	Approver string          `json:"approver"` // base64 key that signed this time
}

// SignApproverSet records one current approver's signature over a new set
// (generation must be the current one plus one) and, once the current
// threshold of them signed the same set, makes it current, records it in
// the chain nodes receive, and pokes the gateways. A key outside the
// current set is ACCESS_DENIED, a bad signature INVALID_INPUT, a second
// signature by the same approver CONFLICT.
func (s *Service) SignApproverSet(ctx context.Context, actor audit.Entry, generation uint64, threshold int, keys [][]byte, approverKey, sig []byte) (SetChangeStatus, error) {
	cur, err := s.Current(ctx)
	if err != nil {
		return SetChangeStatus{}, err
	}
	next, msg, err := checkSetSignature(cur, s.deployment, generation, threshold, keys, approverKey, sig)
	if err != nil {
		return SetChangeStatus{}, err
	}
	now := s.clk.Now()
	st := SetChangeStatus{Proposed: view(s.deployment, next), Needed: cur.Threshold, Approver: base64.StdEncoding.EncodeToString(approverKey)}
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, sqlInsertSetSignature, int64(generation), msg, approverKey, sig, threshold, bytes.Join(next.RawKeys(), nil), actor.Actor, now.UnixMilli()); err != nil {
			if store.IsUniqueViolation(err) {
				return errs.New(errs.Conflict, "this approver already signed this approver set")
			}
			return fmt.Errorf("quorum: insert approver-set signature: %w", err)
		}
		sigs, err := setSignatures(ctx, tx, generation, msg)
		if err != nil {
			return err
		}
		st.Signed, st.Applied = setChangeOutcome(cur, s.deployment, next, msg, sigs)
		if st.Applied {
			if err := s.insertApproverSet(ctx, tx, next, sigs, now); err != nil {
				return err
			}
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:approvers:sign", fmt.Sprintf("approver-set/%d", generation), "allowed"
		actor.Details = map[string]any{"approver_key": st.Approver, "threshold": threshold, "keys": st.Proposed.Keys, "applied": st.Applied}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return SetChangeStatus{}, err
	}
	if st.Applied {
		s.log.Warn("approver set changed", "generation", generation, "threshold", threshold, "keys", len(keys))
		s.bus.Publish(bus.TopicApprovers)
	}
	return st, nil
}

// setSignatures reads the signatures recorded over one proposed set.
func setSignatures(ctx context.Context, tx *sql.Tx, generation uint64, msg []byte) ([]quorumwire.Signature, error) {
	rows, err := tx.QueryContext(ctx, sqlSetSignatures, int64(generation), msg)
	if err != nil {
		return nil, fmt.Errorf("quorum: read approver-set signatures: %w", err)
	}
	defer rows.Close()
	var sigs []quorumwire.Signature
	for rows.Next() {
		var sg quorumwire.Signature
		if err := rows.Scan(&sg.PublicKey, &sg.Signature); err != nil {
			return nil, fmt.Errorf("quorum: scan approver-set signature: %w", err)
		}
		sigs = append(sigs, sg)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("quorum: read approver-set signatures: %w", err)
	}
	return sigs, nil
}

// insertApproverSet records next, with the signatures that carried it, in
// the chain nodes receive.
func (s *Service) insertApproverSet(ctx context.Context, tx *sql.Tx, next quorumwire.ApproverSet, sigs []quorumwire.Signature, now time.Time) error {
	enc, err := json.Marshal(sigs)
	if err != nil {
		return fmt.Errorf("quorum: encode signatures: %w", err)
	}
	if _, err := tx.ExecContext(ctx, sqlInsertApproverSet,
		int64(next.Generation), s.deployment, next.Threshold, bytes.Join(next.RawKeys(), nil), string(enc), now.UnixMilli()); err != nil {
		if store.IsUniqueViolation(err) {
			return errs.New(errs.Conflict, "another approver set took this generation")
		}
		return fmt.Errorf("quorum: insert approver set: %w", err)
	}
	return nil
}
