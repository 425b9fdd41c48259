// Package commands owns the command queue: creating a command (with its
// audit row in one transaction), handing signed commands to the gateway,
// and recording the node's signed updates, which are `attested` only when
// the node's own certificate verifies them.
//
// The package never signs a command: the signing worker (package signing)
// does, and the gateway relays the stored bytes verbatim. The commands
// table belongs to Store (store.go); the pure decisions are in decide.go.
package commands

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/store"
)

// States of a command: the wire.State constants, under the names this
// package has always used.
const (
	StateQueued    = wire.StateQueued
	StateSent      = wire.StateSent
	StateRunning   = wire.StateRunning
	StateSucceeded = wire.StateSucceeded
	StateFailed    = wire.StateFailed
	StateCancelled = wire.StateCancelled
)

// Terminal reports whether state is final (wire.State.Terminal).
func Terminal(state wire.State) bool { return state.Terminal() }

// The signature contexts, re-exported from package wire.
const (
	UpdateSigContext  = wire.UpdateSigContext
	CommandSigContext = wire.CommandSigContext
)

// AttestGrace is how long after its expiry a node certificate still attests
// results (for results journaled offline).
const AttestGrace = 7 * 24 * time.Hour

// MaxPayload bounds a command's payload.
const MaxPayload = 64 << 10

// MaxFanout bounds how many nodes one fan-out may address.
const MaxFanout = 10000

// Command is a command as the API shows it.
type Command struct {
	ID        string          `json:"id"`
	NodeID    string          `json:"node_id"`
	TenantID  string          `json:"tenant_id"`
	Kind      string          `json:"kind"`
	Payload   json.RawMessage `json:"payload"`
	State     wire.State      `json:"state"`
	Attested  bool            `json:"attested"`
	Result    json.RawMessage `json:"result"`
	Reason    string          `json:"reason"`
	CreatedBy string          `json:"created_by"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	ExpiresAt time.Time       `json:"expires_at"`
	BatchID   string          `json:"batch_id,omitempty"`
	// FanoutID groups the commands one fan-out made ("" for a command
	// made alone).
	FanoutID string `json:"fanout_id,omitempty"`
	// subject is the tenant a module's command works for (CreateFor);
	// only the insert writes it.
	subject string
	// Late is true when the result arrived after the sweep had cancelled
	// the command as expired: its node proved (an attested result) that
	// it ran the command, so State is what the node reported, not
	// cancelled.
	Late bool `json:"late"`
}

// Nodes is what the command queue reads of the fleet; the nodes module
// implements it (the commands module never reads the nodes tables).
type Nodes interface {
	// CertStates returns the records of the given serials; an unknown
	// serial is absent.
	CertStates(ctx context.Context, serials []string) (map[string]nodes.CertState, error)
	// TenantRoles returns the tenant and role of each node of ids that
	// exists; an unknown node is absent.
	TenantRoles(ctx context.Context, ids []string) (map[string]nodes.TenantRole, error)
}

// Batches is the destructive-batch quorum as the command queue sees it
// (the quorum module implements it). A batched command waits unsigned in
// the queue until its batch is approved, then travels with the approval and
// its leaf's inclusion proof.
type Batches interface {
	// Admits returns nil when batchID, visible to tenant and unexpired, has
	// a leaf for (nodeID, kind, payload); NOT_FOUND, INVALID_STATE or
	// INVALID_INPUT otherwise.
	Admits(ctx context.Context, tenant, batchID, nodeID, kind string, payload []byte) error
	// Delivery returns the approval and the inclusion proof to send with a
	// command of batchID (the proof is nil when no leaf admits it).
	Delivery(ctx context.Context, batchID, nodeID, kind string, payload []byte) (*nodev1.BatchApproval, *nodev1.InclusionProof, error)
}

// Deps are the commands module's dependencies. Every field is required
// (New panics on a missing one) except Secrets.
type Deps struct {
	// Store is the commands table (NewStore); the signer and the secrets
	// broker are handed the same Store.
	Store *Store
	Clock clock.Clock
	Bus   *bus.Bus
	// Nodes answers nodes' tenants and roles and certificates' states.
	Nodes Nodes
	// Batches is the quorum module: batched commands are admitted and
	// delivered through it.
	Batches Batches
	// Quotas admits commands against the commands_in_flight quota.
	Quotas *quota.Service
	// Secrets checks the secret references a payload names. nil: the
	// process runs no secrets module, and every payload naming a
	// reference is refused INVALID_CONFIG (a payload naming none is
	// unaffected).
	Secrets SecretChecker
	Log     *slog.Logger
}

// Service is the commands module.
type Service struct {
	store   *Store
	clk     clock.Clock
	bus     *bus.Bus
	nodes   Nodes
	batches Batches
	quotas  *quota.Service
	secrets SecretChecker // nil: references refused INVALID_CONFIG
	log     *slog.Logger
	// retry runs the queue's writes (results, sent marks, the sweep)
	// again after a deadlock, a serialization failure or a lost database
	// connection, a bounded number of times (store.DefaultRetry).
	retry store.Retry
}

// New returns the commands module. It panics when a required dependency
// (every field of Deps but Secrets) is missing: that is a wiring error,
// never a state to run in.
func New(d Deps) *Service {
	switch {
	case d.Store == nil:
		panic("commands: New needs Deps.Store")
	case d.Clock == nil:
		panic("commands: New needs Deps.Clock")
	case d.Bus == nil:
		panic("commands: New needs Deps.Bus")
	case d.Nodes == nil:
		panic("commands: New needs Deps.Nodes")
	case d.Batches == nil:
		panic("commands: New needs Deps.Batches")
	case d.Quotas == nil:
		panic("commands: New needs Deps.Quotas")
	case d.Log == nil:
		panic("commands: New needs Deps.Log")
	}
	return &Service{store: d.Store, clk: d.Clock, bus: d.Bus, nodes: d.Nodes, batches: d.Batches, quotas: d.Quotas, secrets: d.Secrets, log: d.Log,
		retry: store.DefaultRetry(d.Clock)}
}

// Store returns the commands table the service writes (the one given in
// Deps).
func (s *Service) Store() *Store { return s.store }

// Create queues a command for nodeID, with its audit row in the same
// transaction, and wakes the signing worker. The actor's tenant is the
// caller's scope: a node outside it is NOT_FOUND. It is the generic
// command path: a kind a module owns (kinds.Owner) is refused
// (kind-owned-by-module), as is a kind the node's role does not run
// (kind-not-allowed-for-role) and a payload naming a secret the command may
// not use (ErrSecretNotFound).
func (s *Service) Create(ctx context.Context, actor audit.Entry, nodeID, kind string, payload json.RawMessage, ttl time.Duration) (Command, error) {
	return s.create(ctx, actor, "", nodeID, kind, payload, ttl, "")
}

// CreateOwned queues a command of a kind that module owns (kinds.Owner);
// only that module calls it, after its own authorization decision. The
// other checks are those of Create.
func (s *Service) CreateOwned(ctx context.Context, module string, actor audit.Entry, nodeID, kind string, payload json.RawMessage, ttl time.Duration) (Command, error) {
	if module == "" {
		return Command{}, errs.New(errs.InvalidInput, "module is required")
	}
	return s.create(ctx, actor, module, nodeID, kind, payload, ttl, "")
}

// CreateFor is CreateOwned for a command that works for subject, a tenant
// other than its node's (a sandbox's tenant on a fleet host): the command
// records subject, and its payload may name secret references, each of
// which must be a live secret of subject (ErrSecretNotFound otherwise).
// Only sandbox.create, sandbox.update and sandbox.exec of the sandboxes
// module take a subject (INVALID_INPUT otherwise). The secrets broker releases such a
// secret only to the command's node, only while the command is live, and
// only when its env names the reference.
func (s *Service) CreateFor(ctx context.Context, module string, actor audit.Entry, subject, nodeID, kind string, payload json.RawMessage, ttl time.Duration) (Command, error) {
	if subject == "" {
		return Command{}, errs.New(errs.InvalidInput, ReasonSubjectNotAllowed)
	}
	return s.createSubject(ctx, actor, module, subject, nodeID, kind, payload, ttl)
}

// CreateInBatch queues a command that belongs to batchID: the batch must
// have a leaf for (node, kind, payload) (INVALID_INPUT otherwise; the node
// checks again). The payload is stored in canonical form (compact JSON) so
// that the signed bytes are the ones the leaf's digest names. The command
// stays queued and unsigned until the batch has its quorum; the worker then
// signs the batch id into its body. It is on the generic path, like Create.
func (s *Service) CreateInBatch(ctx context.Context, actor audit.Entry, nodeID, kind string, payload json.RawMessage, ttl time.Duration, batchID string) (Command, error) {
	if batchID == "" {
		return Command{}, errs.New(errs.InvalidInput, "batch_id is required")
	}
	if err := checkKind(kind, ""); err != nil {
		return Command{}, err
	}
	// The node's role is checked before the batch is consulted, so a kind
	// the role does not run answers kind-not-allowed-for-role here too.
	node, found, err := s.node(ctx, nodeID)
	if err != nil {
		return Command{}, err
	}
	if err := checkTarget(iam.ScopeOf(actor.TenantID), node, found, kind); err != nil {
		return Command{}, err
	}
	canon, err := quorumwire.CanonicalPayload(payload)
	if err != nil {
		return Command{}, errs.Wrap(errs.InvalidInput, "payload: not valid JSON of at most 64 KiB", err)
	}
	if err := s.batches.Admits(ctx, actor.TenantID, batchID, nodeID, kind, canon); err != nil {
		return Command{}, err
	}
	return s.create(ctx, actor, "", nodeID, kind, canon, ttl, batchID)
}

// node reads one node's tenant and role; found is false when it does not
// exist.
func (s *Service) node(ctx context.Context, nodeID string) (nodes.TenantRole, bool, error) {
	rs, err := s.nodes.TenantRoles(ctx, []string{nodeID})
	if err != nil {
		return nodes.TenantRole{}, false, fmt.Errorf("commands: read node: %w", err)
	}
	r, ok := rs[nodeID]
	return r, ok, nil
}

// create reads the node, decides (checkCreate, then the secret
// references), and writes the command and its audit row.
func (s *Service) create(ctx context.Context, actor audit.Entry, module, nodeID, kind string, payload json.RawMessage, ttl time.Duration, batchID string) (Command, error) {
	return s.createAs(ctx, actor, createRequest{module: module, kind: kind, payload: payload, ttl: ttl}, nodeID, batchID)
}

// createSubject is create for a command working for subject (CreateFor).
func (s *Service) createSubject(ctx context.Context, actor audit.Entry, module, subject, nodeID, kind string, payload json.RawMessage, ttl time.Duration) (Command, error) {
	return s.createAs(ctx, actor, createRequest{module: module, kind: kind, payload: payload, ttl: ttl, subject: subject}, nodeID, "")
}

// createAs is create for request r (its scope is the actor's tenant).
func (s *Service) createAs(ctx context.Context, actor audit.Entry, r createRequest, nodeID, batchID string) (Command, error) {
	p, err := s.prepare(ctx, actor, r, nodeID, batchID)
	if err != nil {
		return Command{}, err
	}
	if err := s.store.tx(ctx, func(tx *sql.Tx) error { return p.Write(ctx, tx) }); err != nil {
		return Command{}, err
	}
	p.Queued()
	return p.c, nil
}

// Prepared is a command decided and ready to be written in its caller's
// own transaction (PrepareOwned, PrepareFor): a module whose state change
// and command must commit together (a warm claim and its sandbox.update)
// writes both in one transaction.
type Prepared struct {
	s      *Service
	c      Command
	actor  audit.Entry
	tenant string
	digest string
}

// PrepareOwned decides a command of a kind that module owns as
// CreateOwned does, without writing it: Write writes it (with its audit
// row and in-flight admission) in the caller's transaction, and Queued
// wakes the signer once that transaction committed.
func (s *Service) PrepareOwned(ctx context.Context, module string, actor audit.Entry, nodeID, kind string, payload json.RawMessage, ttl time.Duration) (*Prepared, error) {
	if module == "" {
		return nil, errs.New(errs.InvalidInput, "module is required")
	}
	return s.prepare(ctx, actor, createRequest{module: module, kind: kind, payload: payload, ttl: ttl}, nodeID, "")
}

// PrepareFor is PrepareOwned for a command that works for subject, as
// CreateFor decides it.
func (s *Service) PrepareFor(ctx context.Context, module string, actor audit.Entry, subject, nodeID, kind string, payload json.RawMessage, ttl time.Duration) (*Prepared, error) {
	if subject == "" {
		return nil, errs.New(errs.InvalidInput, ReasonSubjectNotAllowed)
	}
	return s.prepare(ctx, actor, createRequest{module: module, kind: kind, payload: payload, ttl: ttl, subject: subject}, nodeID, "")
}

// prepare reads the node and decides request r (checkCreate, then the
// secret references, against the subject's tenant when r has one).
func (s *Service) prepare(ctx context.Context, actor audit.Entry, r createRequest, nodeID, batchID string) (*Prepared, error) {
	if err := checkKind(r.kind, r.module); err != nil {
		return nil, err // before the read, as always
	}
	node, found, err := s.node(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	r.scope = iam.ScopeOf(actor.TenantID)
	plan, err := checkCreate(r, node, found)
	if err != nil {
		return nil, err
	}
	refsTenant := plan.tenant
	if r.subject != "" {
		refsTenant = r.subject
	}
	if err := s.checkSecrets(ctx, refsTenant, plan.refs); err != nil {
		return nil, err
	}
	c := newCommand(actor, nodeID, plan.tenant, r.kind, plan.payload, s.clk.Now(), plan.ttl)
	c.BatchID, c.subject = batchID, r.subject
	return &Prepared{s: s, c: c, actor: actor, tenant: plan.tenant, digest: payloadDigest(plan.payload)}, nil
}

// Command is the command as Write writes it.
func (p *Prepared) Command() Command { return p.c }

// Write admits the command against its tenant's in-flight quota and
// writes it and its audit row in tx.
func (p *Prepared) Write(ctx context.Context, tx *sql.Tx) error {
	if err := p.s.admitInFlight(ctx, tx, map[string]int64{p.tenant: 1}); err != nil {
		return err
	}
	if err := p.s.store.insert(ctx, tx, p.c); err != nil {
		return err
	}
	e := createdEntry(p.actor, p.c, p.digest)
	if p.c.BatchID != "" {
		e.Details["batch_id"] = p.c.BatchID
	}
	if p.c.subject != "" {
		e.Details["subject_tenant"] = p.c.subject
	}
	return audit.Record(ctx, tx, p.c.CreatedAt, e)
}

// Queued wakes the signer for the written command (after its commit).
func (p *Prepared) Queued() { p.s.bus.Publish(bus.TopicSign) }

// newCommand is a new queued command.
func newCommand(actor audit.Entry, nodeID, tenant, kind string, payload json.RawMessage, now time.Time, ttl time.Duration) Command {
	return Command{ID: ids.New("c"), NodeID: nodeID, TenantID: tenant, Kind: kind, Payload: payload, State: StateQueued,
		CreatedBy: actor.Actor, CreatedAt: now.UTC(), UpdatedAt: now.UTC(), ExpiresAt: now.Add(ttl).UTC()}
}

// payloadDigest is the hex SHA-256 of a payload, as the audit row names it.
func payloadDigest(payload []byte) string {
	return fmt.Sprintf("%x", sha256.Sum256(payload))
}

// createdEntry is the audit row of c's creation by actor.
func createdEntry(actor audit.Entry, c Command, digest string) audit.Entry {
	e := actor
	e.TenantID = c.TenantID
	e.Action, e.Resource, e.Outcome = "compute:commands:create", "command/"+c.ID, "allowed"
	e.Details = map[string]any{"node_id": c.NodeID, "kind": c.Kind, "payload_sha256": digest}
	return e
}

// CreateMany queues one command of kind for each of nodeIDs in a single
// transaction (each with its audit row), and wakes the signer once. Every
// node must be visible in the actor's tenant (all of them for the root
// tenant); a node named twice gets one command. The commands share a new
// fan-out id (Command.FanoutID), which lists and counts them together.
func (s *Service) CreateMany(ctx context.Context, actor audit.Entry, nodeIDs []string, kind string, payload json.RawMessage, ttl time.Duration) ([]Command, error) {
	plan, err := checkFanout(kind, len(nodeIDs), payload, ttl)
	if err != nil {
		return nil, err
	}
	// The nodes' tenants and roles are read, and every node checked, before
	// the transaction: a node's tenant and role never change, and the
	// secrets check runs on its own connection.
	records, err := s.nodes.TenantRoles(ctx, nodeIDs)
	if err != nil {
		return nil, fmt.Errorf("commands: read node tenants: %w", err)
	}
	targets, tenants, refusal := checkFanoutNodes(iam.ScopeOf(actor.TenantID), kind, nodeIDs, records)
	for _, t := range tenants {
		if err := s.checkSecrets(ctx, t, plan.refs); err != nil {
			return nil, err
		}
	}
	if refusal != nil {
		return nil, refusal
	}
	now := s.clk.Now()
	out := make([]Command, 0, len(targets))
	fanoutID := ids.New("fo")
	for _, t := range targets {
		c := newCommand(actor, t.nodeID, t.tenant, kind, plan.payload, now, plan.ttl)
		c.FanoutID = fanoutID
		out = append(out, c)
	}
	if err := s.insertMany(ctx, actor, out, len(nodeIDs), now); err != nil {
		return nil, err
	}
	s.bus.Publish(bus.TopicSign)
	return out, nil
}

// insertMany writes a fan-out's commands and their audit rows in one
// transaction, after admitting them against the in-flight quota; fanout is
// the number of nodes the caller named (the audit rows record it).
func (s *Service) insertMany(ctx context.Context, actor audit.Entry, cs []Command, fanout int, now time.Time) error {
	digest := payloadDigest(cs[0].Payload)
	return s.store.tx(ctx, func(tx *sql.Tx) error {
		if err := s.admitInFlight(ctx, tx, perTenant(cs)); err != nil {
			return err
		}
		for chunk := range slices.Chunk(cs, insertPerStmt) {
			if err := s.store.insertMany(ctx, tx, chunk); err != nil {
				return err
			}
			entries := make([]audit.Entry, 0, len(chunk))
			for _, c := range chunk {
				e := createdEntry(actor, c, digest)
				e.Details["fanout"] = fanout
				e.Details["fanout_id"] = c.FanoutID
				entries = append(entries, e)
			}
			if err := audit.RecordMany(ctx, tx, s.store.db.Dialect, now, entries); err != nil {
				return err
			}
		}
		return nil
	})
}
