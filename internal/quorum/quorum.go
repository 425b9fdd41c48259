// Package quorum is the control plane's destructive-batch module: it
// stores batches (leaves of node, kind and payload digest under an RFC 6962
// Merkle root) with who proposed them, collects approvals signed by the
// pinned approvers (each approver once), tells the command queue when a
// batch has its quorum, and builds what travels with a batched command: the
// approval and the inclusion proof of the command's own leaf. It also
// collects the current approvers' signatures over a new approver set.
//
// Nothing here is trusted by a node: bcd checks every signature, the
// threshold, the expiry and the proof itself (package quorumwire). The
// module's own checks keep honest mistakes out of the queue.
package quorum

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
	"github.com/bettercompute/bettercompute/internal/store"
)

// States of a batch.
const (
	StateProposed = "proposed" // waiting for approvals
	StateApproved = "approved" // the threshold of pinned approvers signed
)

// detailRoot is the audit detail holding a batch's Merkle root (hex): a
// hash, not a tenant.
const detailRoot = "root" // archtest:not-tenant (the Merkle root)

// DefaultLifetime is a batch's lifetime when the proposer gives none.
const DefaultLifetime = time.Hour

// UnboundFlag is shown next to every unbound leaf.
const UnboundFlag = "UNBOUND: admits any payload of this kind for this node"

// NodeLookup finds a node's tenant; the nodes module implements it.
type NodeLookup interface {
	TenantOf(ctx context.Context, nodeID string) (string, error)
}

// Service is the quorum module.
type Service struct {
	db         *store.DB
	clk        clock.Clock
	bus        *bus.Bus
	nodes      NodeLookup
	deployment string
	pinned     quorumwire.ApproverSet // generation 0: the set in the trust bundle (zero when none)
	log        *slog.Logger
}

// New returns the quorum module for deployment. pinned holds the approver
// keys pinned in the PKI bundle's trust bundle and their threshold (none:
// no batch can ever be approved).
func New(db *store.DB, clk clock.Clock, b *bus.Bus, nodes NodeLookup, deployment string, pinned [][]byte, threshold int, log *slog.Logger) (*Service, error) {
	s := &Service{db: db, clk: clk, bus: b, nodes: nodes, deployment: deployment, log: log}
	if len(pinned) > 0 {
		set, err := quorumwire.NewApproverSet(0, threshold, pinned)
		if err != nil {
			return nil, errs.Wrap(errs.InvalidConfig, "the pinned approver set is not valid", err)
		}
		s.pinned = set
	}
	return s, nil
}

// Deployment returns the deployment name approvals are signed for.
func (s *Service) Deployment() string { return s.deployment }

// LeafInput is one leaf as a proposer asks for it: Payload is bound unless
// Unbound (an empty payload binds "{}", the payload commands default to).
type LeafInput struct {
	NodeID  string          `json:"node_id"`
	Kind    string          `json:"kind"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Unbound bool            `json:"unbound,omitempty"`
}

// LeafView is a leaf as shown to reviewers.
type LeafView struct {
	Index         int             `json:"index"`
	NodeID        string          `json:"node_id"`
	Kind          string          `json:"kind"`
	Unbound       bool            `json:"unbound"`
	Flag          string          `json:"flag,omitempty"`
	PayloadSHA256 string          `json:"payload_sha256,omitempty"` // hex
	Payload       json.RawMessage `json:"payload,omitempty"`
}

// ApprovalView is one recorded approval.
type ApprovalView struct {
	ApproverKey string    `json:"approver_key"` // base64
	Signature   string    `json:"signature"`    // base64
	SubmittedBy string    `json:"submitted_by"`
	CreatedAt   time.Time `json:"created_at"`
}

// Batch is a batch as the API shows it.
type Batch struct {
	ID         string         `json:"id"`
	TenantID   string         `json:"tenant_id"`
	Deployment string         `json:"deployment"`
	Root       string         `json:"root"` // hex
	State      string         `json:"state"`
	Threshold  int            `json:"threshold"`
	Approvals  []ApprovalView `json:"approvals"`
	Leaves     []LeafView     `json:"leaves"`
	Unbound    bool           `json:"unbound"` // any leaf is unbound
	ProposedBy string         `json:"proposed_by"`
	Agent      string         `json:"agent,omitempty"`
	AgentFor   string         `json:"agent_for,omitempty"`
	Proposer   string         `json:"proposer"` // for humans: "proposed by agent X for Y"
	CreatedAt  time.Time      `json:"created_at"`
	ExpiresAt  time.Time      `json:"expires_at"`
	ExpiresMS  int64          `json:"expires_at_ms"` // what approvers sign
	ApprovedAt *time.Time     `json:"approved_at,omitempty"`
}

// Agent is the agent that proposes a batch and the person it acts for,
// by name, as its recorded delegation says (the zero value: the proposer
// is no agent).
type Agent struct {
	Name string
	For  string
}

func proposerText(by, agent, agentFor string) string {
	if agent != "" {
		return fmt.Sprintf("proposed by agent %s for %s", agent, agentFor)
	}
	return "proposed by " + by
}

// Create records a proposed batch of leaves, in order, with its Merkle
// root, its proposer (an agent, from its delegation, is recorded as one:
// "proposed by agent X for Y"), an expiry ttl from now
// (default DefaultLifetime, at most quorumwire.MaxBatchLifetime) and its
// audit row, in one transaction.
func (s *Service) Create(ctx context.Context, actor audit.Entry, ag Agent, in []LeafInput, ttl time.Duration) (Batch, error) {
	ttl, err := checkShape(len(in), ttl)
	if err != nil {
		return Batch{}, err
	}
	tenants, tenantErr := s.leafTenants(ctx, in)
	p, err := planLeaves(iam.ScopeOf(actor.TenantID), in, tenants, tenantErr)
	if err != nil {
		return Batch{}, err
	}
	now := s.clk.Now()
	id := ids.New("b")
	agent, agentFor := ag.Name, ag.For
	expires := now.Add(ttl).UnixMilli()
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, sqlInsertBatch,
			id, p.tenant, s.deployment, p.root, len(p.leaves), StateProposed, actor.Actor, agent, agentFor, now.UnixMilli(), expires); err != nil {
			return fmt.Errorf("quorum: insert batch: %w", err)
		}
		for i, l := range p.leaves {
			if _, err := tx.ExecContext(ctx, sqlInsertLeaf, id, i, l.NodeID, l.Kind, leafUnbound(l), l.PayloadSHA256[:], p.payloads[i]); err != nil {
				return fmt.Errorf("quorum: insert leaf: %w", err)
			}
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:batches:create", "batch/"+id, "allowed"
		actor.Details = map[string]any{detailRoot: hex.EncodeToString(p.root), "leaves": len(p.leaves), "agent": agent, "agent_for": agentFor}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return Batch{}, err
	}
	s.log.Info("batch proposed", "batch_id", id, "leaves", len(p.leaves), "proposed_by", actor.Actor)
	return s.Get(ctx, iam.ScopeOf(actor.TenantID), id)
}

// leafTenants reads the tenant of each leaf's node, in order, stopping at
// the first that cannot be read (err is that failure).
func (s *Service) leafTenants(ctx context.Context, in []LeafInput) ([]string, error) {
	tenants := make([]string, 0, len(in))
	for _, li := range in {
		t, err := s.nodes.TenantOf(ctx, li.NodeID)
		if err != nil {
			return tenants, err
		}
		tenants = append(tenants, t)
	}
	return tenants, nil
}

// ErrNotFound is returned for a batch that does not exist (or is outside
// the caller's tenant).
var ErrNotFound = errs.New(errs.NotFound, "batch not found")

// load reads batch id with its leaves and approvals: ErrNotFound when it
// does not exist or scope does not see it.
func (s *Service) load(ctx context.Context, q querier, scope iam.Scope, id string) (*batchRow, error) {
	r, err := scanBatch(q.QueryRowContext(ctx, sqlBatch, id))
	if errors.Is(err, sql.ErrNoRows) || err == nil && !scope.Sees(r.TenantID) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("quorum: read batch: %w", err)
	}
	if err := loadLeaves(ctx, q, r); err != nil {
		return nil, err
	}
	if err := loadApprovals(ctx, q, r); err != nil {
		return nil, err
	}
	return r, nil
}

// loadLeaves reads r's leaves, in order.
func loadLeaves(ctx context.Context, q querier, r *batchRow) error {
	rows, err := q.QueryContext(ctx, sqlLeaves, r.ID)
	if err != nil {
		return fmt.Errorf("quorum: read leaves: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		l, payload, v, err := scanLeaf(rows)
		if err != nil {
			return fmt.Errorf("quorum: scan leaf: %w", err)
		}
		r.Unbound = r.Unbound || l.Unbound
		r.leaves = append(r.leaves, l)
		r.payloads = append(r.payloads, payload)
		r.Leaves = append(r.Leaves, v)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("quorum: read leaves: %w", err)
	}
	return nil
}

// loadApprovals reads r's approvals, oldest first.
func loadApprovals(ctx context.Context, q querier, r *batchRow) error {
	rows, err := q.QueryContext(ctx, sqlApprovals, r.ID)
	if err != nil {
		return fmt.Errorf("quorum: read approvals: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		sig, v, err := scanApproval(rows)
		if err != nil {
			return fmt.Errorf("quorum: scan approval: %w", err)
		}
		r.approvals = append(r.approvals, sig)
		r.Approvals = append(r.Approvals, v)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("quorum: read approvals: %w", err)
	}
	return nil
}

// Get returns a batch with its leaves and approvals as stored. Reviewers
// must not trust Root: `batch approve` recomputes it from the leaves.
func (s *Service) Get(ctx context.Context, scope iam.Scope, id string) (Batch, error) {
	r, err := s.load(ctx, s.db, scope, id)
	if err != nil {
		return Batch{}, err
	}
	set, err := s.Current(ctx)
	if err != nil {
		return Batch{}, err
	}
	r.Threshold = set.Threshold
	return r.Batch, nil
}

// List returns the newest batches (at most 100) without their leaves.
func (s *Service) List(ctx context.Context, scope iam.Scope) ([]Batch, error) {
	a := s.db.NewArgs()
	rows, err := s.db.QueryContext(ctx, sqlListBatchIDs+scope.Filter(a, "tenant_id")+sqlListBatchIDsEnd, a.Values()...)
	if err != nil {
		return nil, fmt.Errorf("quorum: list: %w", err)
	}
	var idList []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("quorum: list: %w", err)
		}
		idList = append(idList, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("quorum: list: %w", err)
	}
	out := []Batch{}
	for _, id := range idList {
		b, err := s.Get(ctx, scope, id)
		if err != nil {
			return nil, err
		}
		b.Leaves = nil
		out = append(out, b)
	}
	return out, nil
}

// Approve records one approver's signature over (deployment, batch id,
// root, expiry). Only a key of the current approver set is accepted
// (ACCESS_DENIED otherwise), each once (CONFLICT), with a valid signature
// (INVALID_INPUT), on an unexpired batch whose stored leaves still hash to
// its root (INVALID_STATE). When the threshold is reached the batch is
// approved and the signing worker is poked.
func (s *Service) Approve(ctx context.Context, actor audit.Entry, id string, key, sig []byte) (Batch, error) {
	set, err := s.Current(ctx)
	if err != nil {
		return Batch{}, err
	}
	if !set.Contains(key) {
		return Batch{}, errs.New(errs.AccessDenied, "the key is not a pinned approver")
	}
	now := s.clk.Now()
	approved := false
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		r, err := s.load(ctx, tx, iam.ScopeOf(actor.TenantID), id)
		if err != nil {
			return err
		}
		approved, err = checkApproval(set, r, key, sig, now.UnixMilli())
		if err == errRootMismatch {
			s.log.Error("batch leaves do not match their root", "batch_id", id)
		}
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlInsertApproval, id, key, sig, actor.Actor, now.UnixMilli()); err != nil {
			if store.IsUniqueViolation(err) {
				return errs.New(errs.Conflict, "this approver already approved the batch")
			}
			return fmt.Errorf("quorum: insert approval: %w", err)
		}
		if approved {
			if _, err := tx.ExecContext(ctx, sqlMarkApproved, StateApproved, now.UnixMilli(), id, StateProposed); err != nil {
				return fmt.Errorf("quorum: mark approved: %w", err)
			}
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:batches:approve", "batch/"+id, "allowed"
		actor.Details = map[string]any{"approver_key": base64.StdEncoding.EncodeToString(key), detailRoot: r.Root, "quorum_reached": approved}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return Batch{}, err
	}
	if approved {
		s.log.Info("batch approved", "batch_id", id)
		s.bus.Publish(bus.TopicSign)
	}
	return s.Get(ctx, iam.ScopeOf(actor.TenantID), id)
}

// Admits checks that batchID exists for the caller's tenant, has not
// expired, and has a leaf for (nodeID, kind, payload): NOT_FOUND,
// INVALID_STATE or INVALID_INPUT otherwise. payload is canonical.
func (s *Service) Admits(ctx context.Context, tenant, batchID, nodeID, kind string, payload []byte) error {
	r, err := s.load(ctx, s.db, iam.ScopeOf(tenant), batchID)
	if err != nil {
		return err
	}
	return admits(r, s.clk.Now().UnixMilli(), nodeID, kind, payload)
}

// Approved reports whether batchID has reached its quorum and not expired.
func (s *Service) Approved(ctx context.Context, batchID string) (bool, error) {
	var state string
	var expires int64
	err := s.db.QueryRowContext(ctx, sqlBatchState, batchID).Scan(&state, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("quorum: read batch state: %w", err)
	}
	return state == StateApproved && s.clk.Now().UnixMilli() < expires, nil
}

// Delivery builds what travels with a batched command: the approval as
// stored (deployment, id, root, expiry, every recorded signature) and the
// inclusion proof of the first leaf admitting (nodeID, kind, payload),
// preferring a bound leaf. With no such leaf the proof is nil. The node
// checks both; nothing here is trusted.
func (s *Service) Delivery(ctx context.Context, batchID, nodeID, kind string, payload []byte) (*nodev1.BatchApproval, *nodev1.InclusionProof, error) {
	r, err := s.load(ctx, s.db, iam.RootScope(), batchID)
	if err != nil {
		return nil, nil, err
	}
	ap := &nodev1.BatchApproval{Deployment: r.Deployment, BatchId: r.ID, Root: r.root, ExpiresAtMs: r.expiresMS}
	for _, a := range r.approvals {
		ap.Signatures = append(ap.Signatures, &nodev1.ApproverSignature{PublicKey: a.PublicKey, Signature: a.Signature})
	}
	idx := pickLeaf(r.leaves, nodeID, kind, payload)
	if idx < 0 {
		return ap, nil, nil
	}
	hashes, err := quorumwire.Prove(r.leaves, idx)
	if err != nil {
		return ap, nil, fmt.Errorf("quorum: prove leaf %d of %s: %w", idx, batchID, err)
	}
	return ap, &nodev1.InclusionProof{Leaf: r.leaves[idx].Encode(), LeafIndex: uint64(idx), TreeSize: uint64(len(r.leaves)), Hashes: hashes}, nil
}
