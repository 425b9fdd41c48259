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
	"bytes"
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
	"github.com/bettercompute/bettercompute/internal/store"
)

// States of a batch.
const (
	StateProposed = "proposed" // waiting for approvals
	StateApproved = "approved" // the threshold of pinned approvers signed
)

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

// ParseAgent reads an agent identity. Until delegations exist (the IAM
// issue), an API key whose identity is "agent:X" speaks for agent X on
// behalf of its tenant, and "agent:X@Y" for agent X on behalf of Y.
func ParseAgent(identity, tenant string) (agent, forWhom string) {
	rest, ok := strings.CutPrefix(identity, "agent:")
	if !ok || rest == "" {
		return "", ""
	}
	if a, f, ok := strings.Cut(rest, "@"); ok && a != "" && f != "" {
		return a, f
	}
	return rest, "tenant " + tenant
}

func proposerText(by, agent, agentFor string) string {
	if agent != "" {
		return fmt.Sprintf("proposed by agent %s for %s", agent, agentFor)
	}
	return "proposed by " + by
}

// Create records a proposed batch of leaves, in order, with its Merkle
// root, its proposer (an agent is recorded as one), an expiry ttl from now
// (default DefaultLifetime, at most quorumwire.MaxBatchLifetime) and its
// audit row, in one transaction.
func (s *Service) Create(ctx context.Context, actor audit.Entry, in []LeafInput, ttl time.Duration) (Batch, error) {
	if len(in) == 0 || len(in) > quorumwire.MaxLeaves {
		return Batch{}, errs.New(errs.InvalidInput, fmt.Sprintf("leaves: a batch holds 1..%d leaves", quorumwire.MaxLeaves))
	}
	if ttl == 0 {
		ttl = DefaultLifetime
	}
	if ttl < 0 || ttl > quorumwire.MaxBatchLifetime {
		return Batch{}, errs.New(errs.InvalidInput, "expires: between 1 second and 7 days")
	}
	leaves := make([]quorumwire.Leaf, len(in))
	payloads := make([][]byte, len(in))
	seen := map[string]bool{}
	tenant := ""
	for i, li := range in {
		if !kinds.Known(li.Kind) {
			return Batch{}, errs.New(errs.InvalidInput, fmt.Sprintf("leaves[%d].kind: unknown command kind", i))
		}
		t, err := s.nodes.TenantOf(ctx, li.NodeID)
		if err != nil {
			return Batch{}, err
		}
		if actor.TenantID != "root" && actor.TenantID != t {
			return Batch{}, errs.New(errs.NotFound, "node not found")
		}
		if tenant == "" {
			tenant = t
		}
		if li.Unbound {
			if len(li.Payload) > 0 {
				return Batch{}, errs.New(errs.InvalidInput, fmt.Sprintf("leaves[%d]: an unbound leaf takes no payload", i))
			}
			leaves[i] = quorumwire.UnboundLeaf(li.NodeID, li.Kind)
		} else {
			p, err := quorumwire.CanonicalPayload(li.Payload)
			if err != nil {
				return Batch{}, errs.Wrap(errs.InvalidInput, fmt.Sprintf("leaves[%d].payload: not valid JSON of at most 64 KiB", i), err)
			}
			payloads[i] = p
			leaves[i] = quorumwire.BoundLeaf(li.NodeID, li.Kind, p)
		}
		if err := leaves[i].Validate(); err != nil {
			return Batch{}, errs.Wrap(errs.InvalidInput, fmt.Sprintf("leaves[%d]: not a valid leaf", i), err)
		}
		enc := string(leaves[i].Encode())
		if seen[enc] {
			return Batch{}, errs.New(errs.InvalidInput, fmt.Sprintf("leaves[%d]: the same leaf twice", i))
		}
		seen[enc] = true
	}
	root, err := quorumwire.Root(leaves)
	if err != nil {
		return Batch{}, errs.Wrap(errs.InvalidInput, "leaves: no Merkle root", err)
	}
	now := s.clk.Now()
	id := ids.New("b")
	agent, agentFor := ParseAgent(actor.Actor, actor.TenantID)
	expires := now.Add(ttl).UnixMilli()
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO batches (id, tenant_id, deployment, root, leaf_count, state, proposed_by, agent, agent_for, created_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
			id, tenant, s.deployment, root, len(leaves), StateProposed, actor.Actor, agent, agentFor, now.UnixMilli(), expires); err != nil {
			return fmt.Errorf("quorum: insert batch: %w", err)
		}
		for i, l := range leaves {
			unbound := 0
			if l.Unbound {
				unbound = 1
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO batch_leaves (batch_id, idx, node_id, kind, unbound, payload_sha256, payload) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
				id, i, l.NodeID, l.Kind, unbound, l.PayloadSHA256[:], payloads[i]); err != nil {
				return fmt.Errorf("quorum: insert leaf: %w", err)
			}
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:batches:create", "batch/"+id, "allowed"
		actor.Details = map[string]any{"root": hex.EncodeToString(root), "leaves": len(leaves), "agent": agent, "agent_for": agentFor}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return Batch{}, err
	}
	s.log.Info("batch proposed", "batch_id", id, "leaves", len(leaves), "proposed_by", actor.Actor)
	return s.Get(ctx, actor.TenantID, id)
}

// ErrNotFound is returned for a batch that does not exist (or is outside
// the caller's tenant).
var ErrNotFound = errs.New(errs.NotFound, "batch not found")

type batchRow struct {
	Batch
	root        []byte
	expiresMS   int64
	leaves      []quorumwire.Leaf
	payloads    [][]byte
	approvals   []quorumwire.Signature
	leafCount   int
	approvedAtN sql.NullInt64
}

func (s *Service) load(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, tenant, id string) (*batchRow, error) {
	var r batchRow
	var created int64
	err := q.QueryRowContext(ctx, `SELECT id, tenant_id, deployment, root, leaf_count, state, proposed_by, agent, agent_for, created_at, expires_at, approved_at
		FROM batches WHERE id = $1`, id).Scan(&r.ID, &r.TenantID, &r.Deployment, &r.root, &r.leafCount, &r.State, &r.ProposedBy, &r.Agent, &r.AgentFor,
		&created, &r.expiresMS, &r.approvedAtN)
	if errors.Is(err, sql.ErrNoRows) || err == nil && tenant != "root" && r.TenantID != tenant {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("quorum: read batch: %w", err)
	}
	r.Root = hex.EncodeToString(r.root)
	r.CreatedAt, r.ExpiresAt, r.ExpiresMS = time.UnixMilli(created).UTC(), time.UnixMilli(r.expiresMS).UTC(), r.expiresMS
	if r.approvedAtN.Valid {
		t := time.UnixMilli(r.approvedAtN.Int64).UTC()
		r.ApprovedAt = &t
	}
	r.Proposer = proposerText(r.ProposedBy, r.Agent, r.AgentFor)
	rows, err := q.QueryContext(ctx, `SELECT idx, node_id, kind, unbound, payload_sha256, payload FROM batch_leaves WHERE batch_id = $1 ORDER BY idx`, id)
	if err != nil {
		return nil, fmt.Errorf("quorum: read leaves: %w", err)
	}
	for rows.Next() {
		var v LeafView
		var unbound int
		var digest, payload []byte
		if err := rows.Scan(&v.Index, &v.NodeID, &v.Kind, &unbound, &digest, &payload); err != nil {
			rows.Close()
			return nil, fmt.Errorf("quorum: scan leaf: %w", err)
		}
		l := quorumwire.Leaf{NodeID: v.NodeID, Kind: v.Kind, Unbound: unbound != 0}
		copy(l.PayloadSHA256[:], digest)
		v.Unbound = l.Unbound
		if l.Unbound {
			v.Flag = UnboundFlag
			r.Unbound = true
		} else {
			v.PayloadSHA256 = hex.EncodeToString(digest)
			if len(payload) > 0 {
				v.Payload = json.RawMessage(payload)
			}
		}
		r.leaves = append(r.leaves, l)
		r.payloads = append(r.payloads, payload)
		r.Leaves = append(r.Leaves, v)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("quorum: read leaves: %w", err)
	}
	arows, err := q.QueryContext(ctx, `SELECT approver_key, signature, submitted_by, created_at FROM batch_approvals WHERE batch_id = $1 ORDER BY created_at, approver_key`, id)
	if err != nil {
		return nil, fmt.Errorf("quorum: read approvals: %w", err)
	}
	defer arows.Close()
	for arows.Next() {
		var sig quorumwire.Signature
		var v ApprovalView
		var at int64
		if err := arows.Scan(&sig.PublicKey, &sig.Signature, &v.SubmittedBy, &at); err != nil {
			return nil, fmt.Errorf("quorum: scan approval: %w", err)
		}
		v.ApproverKey = base64.StdEncoding.EncodeToString(sig.PublicKey)
		v.Signature = base64.StdEncoding.EncodeToString(sig.Signature)
		v.CreatedAt = time.UnixMilli(at).UTC()
		r.approvals = append(r.approvals, sig)
		r.Approvals = append(r.Approvals, v)
	}
	if err := arows.Err(); err != nil {
		return nil, fmt.Errorf("quorum: read approvals: %w", err)
	}
	if r.Approvals == nil {
		r.Approvals = []ApprovalView{}
	}
	if r.Leaves == nil {
		r.Leaves = []LeafView{}
	}
	return &r, nil
}

// Get returns a batch with its leaves and approvals as stored. Reviewers
// must not trust Root: `batch approve` recomputes it from the leaves.
func (s *Service) Get(ctx context.Context, tenant, id string) (Batch, error) {
	r, err := s.load(ctx, s.db, tenant, id)
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
func (s *Service) List(ctx context.Context, tenant string) ([]Batch, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id FROM batches WHERE tenant_id = $1 OR $1 = 'root' ORDER BY created_at DESC, id LIMIT 100`, tenant)
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
		b, err := s.Get(ctx, tenant, id)
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
		r, err := s.load(ctx, tx, actor.TenantID, id)
		if err != nil {
			return err
		}
		if now.UnixMilli() >= r.expiresMS {
			return errs.New(errs.InvalidState, "the batch has expired")
		}
		root, err := quorumwire.Root(r.leaves)
		if err != nil || !bytes.Equal(root, r.root) {
			s.log.Error("batch leaves do not match their root", "batch_id", id)
			return errs.New(errs.InvalidState, "the batch's leaves do not match its root")
		}
		if !ed25519.Verify(ed25519.PublicKey(key), quorumwire.ApprovalMessage(r.Deployment, r.ID, r.root, r.expiresMS), sig) {
			return errs.New(errs.InvalidInput, "the signature does not verify over this batch")
		}
		for _, a := range r.approvals {
			if bytes.Equal(a.PublicKey, key) {
				return errs.New(errs.Conflict, "this approver already approved the batch")
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO batch_approvals (batch_id, approver_key, signature, submitted_by, created_at) VALUES ($1, $2, $3, $4, $5)`,
			id, key, sig, actor.Actor, now.UnixMilli()); err != nil {
			if store.IsUniqueViolation(err) {
				return errs.New(errs.Conflict, "this approver already approved the batch")
			}
			return fmt.Errorf("quorum: insert approval: %w", err)
		}
		sigs := append(r.approvals, quorumwire.Signature{PublicKey: key, Signature: sig})
		msg := quorumwire.ApprovalMessage(r.Deployment, r.ID, r.root, r.expiresMS)
		if r.State == StateProposed && countValid(set, msg, sigs) >= set.Threshold {
			if _, err := tx.ExecContext(ctx, `UPDATE batches SET state = $1, approved_at = $2 WHERE id = $3 AND state = $4`,
				StateApproved, now.UnixMilli(), id, StateProposed); err != nil {
				return fmt.Errorf("quorum: mark approved: %w", err)
			}
			approved = true
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:batches:approve", "batch/"+id, "allowed"
		actor.Details = map[string]any{"approver_key": base64.StdEncoding.EncodeToString(key), "root": r.Root, "quorum_reached": approved}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return Batch{}, err
	}
	if approved {
		s.log.Info("batch approved", "batch_id", id)
		s.bus.Publish(bus.TopicSign)
	}
	return s.Get(ctx, actor.TenantID, id)
}

// countValid counts distinct keys of set with a valid signature over msg.
func countValid(set quorumwire.ApproverSet, msg []byte, sigs []quorumwire.Signature) int {
	seen := map[string]bool{}
	for _, s := range sigs {
		if set.Contains(s.PublicKey) && !seen[string(s.PublicKey)] && ed25519.Verify(ed25519.PublicKey(s.PublicKey), msg, s.Signature) {
			seen[string(s.PublicKey)] = true
		}
	}
	return len(seen)
}

// Admits checks that batchID exists for the caller's tenant, has not
// expired, and has a leaf for (nodeID, kind, payload): NOT_FOUND,
// INVALID_STATE or INVALID_INPUT otherwise. payload is canonical.
func (s *Service) Admits(ctx context.Context, tenant, batchID, nodeID, kind string, payload []byte) error {
	r, err := s.load(ctx, s.db, tenant, batchID)
	if err != nil {
		return err
	}
	if s.clk.Now().UnixMilli() >= r.expiresMS {
		return errs.New(errs.InvalidState, "the batch has expired")
	}
	for _, l := range r.leaves {
		if l.Admits(nodeID, kind, payload) {
			return nil
		}
	}
	return errs.New(errs.InvalidInput, "the batch has no leaf for this node, kind and payload")
}

// Approved reports whether batchID has reached its quorum and not expired.
func (s *Service) Approved(ctx context.Context, batchID string) (bool, error) {
	var state string
	var expires int64
	err := s.db.QueryRowContext(ctx, `SELECT state, expires_at FROM batches WHERE id = $1`, batchID).Scan(&state, &expires)
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
	r, err := s.load(ctx, s.db, "root", batchID)
	if err != nil {
		return nil, nil, err
	}
	ap := &nodev1.BatchApproval{Deployment: r.Deployment, BatchId: r.ID, Root: r.root, ExpiresAtMs: r.expiresMS}
	for _, a := range r.approvals {
		ap.Signatures = append(ap.Signatures, &nodev1.ApproverSignature{PublicKey: a.PublicKey, Signature: a.Signature})
	}
	idx := -1
	for i, l := range r.leaves {
		if l.Admits(nodeID, kind, payload) && (idx < 0 || r.leaves[idx].Unbound && !l.Unbound) {
			idx = i
		}
	}
	if idx < 0 {
		return ap, nil, nil
	}
	hashes, err := quorumwire.Prove(r.leaves, idx)
	if err != nil {
		return ap, nil, fmt.Errorf("quorum: prove leaf %d of %s: %w", idx, batchID, err)
	}
	return ap, &nodev1.InclusionProof{Leaf: r.leaves[idx].Encode(), LeafIndex: uint64(idx), TreeSize: uint64(len(r.leaves)), Hashes: hashes}, nil
}
