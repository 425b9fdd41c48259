// Package commands owns the command queue: creating a command (with its
// audit row in one transaction), handing signed commands to the gateway,
// and recording the node's signed updates, which are `attested` only when
// the node's own certificate verifies them.
//
// The package never signs a command: the signing worker (package signing)
// does, and the gateway relays the stored bytes verbatim.
package commands

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/store"
)

// States of a command.
const (
	StateQueued    = "queued"
	StateSent      = "sent"
	StateRunning   = "running"
	StateSucceeded = "succeeded"
	StateFailed    = "failed"
	StateCancelled = "cancelled"
)

// Terminal reports whether state is final.
func Terminal(state string) bool {
	return state == StateSucceeded || state == StateFailed || state == StateCancelled
}

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

// Command is a command as the API shows it.
type Command struct {
	ID        string          `json:"id"`
	NodeID    string          `json:"node_id"`
	TenantID  string          `json:"tenant_id"`
	Kind      string          `json:"kind"`
	Payload   json.RawMessage `json:"payload"`
	State     string          `json:"state"`
	Attested  bool            `json:"attested"`
	Result    json.RawMessage `json:"result"`
	Reason    string          `json:"reason"`
	CreatedBy string          `json:"created_by"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	ExpiresAt time.Time       `json:"expires_at"`
	BatchID   string          `json:"batch_id,omitempty"`
}

// CertLookup reads node certificates; the nodes module implements it.
type CertLookup interface {
	// CertStates returns the records of the given serials; an unknown
	// serial is absent.
	CertStates(ctx context.Context, serials []string) (map[string]nodes.CertState, error)
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

// Service is the commands module.
type Service struct {
	db      *store.DB
	clk     clock.Clock
	bus     *bus.Bus
	certs   CertLookup
	nodes   *nodes.Service
	batches Batches
	secrets SecretChecker
	log     *slog.Logger
	quotas  *quota.Service // nil: the default limits
}

// New returns the commands module.
func New(db *store.DB, clk clock.Clock, b *bus.Bus, n *nodes.Service, log *slog.Logger) *Service {
	return &Service{db: db, clk: clk, bus: b, certs: n, nodes: n, log: log}
}

// UseBatches connects the quorum module; call it before the service is
// used. Without it a batched command is refused INVALID_CONFIG.
func (s *Service) UseBatches(b Batches) { s.batches = b }

// Create queues a command for nodeID, with its audit row in the same
// transaction, and wakes the signing worker. It is the generic command
// path: a kind a module owns (kinds.Owner) is refused
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
	if s.batches == nil {
		return Command{}, errs.New(errs.InvalidConfig, "the quorum module is not running")
	}
	if err := checkKind(kind, ""); err != nil {
		return Command{}, err
	}
	// The node's role is checked before the batch is consulted, so a kind
	// the role does not run answers kind-not-allowed-for-role here too.
	node, err := s.nodeOf(ctx, nodeID)
	if err != nil {
		return Command{}, err
	}
	if actor.TenantID != "root" && actor.TenantID != node.tenant {
		return Command{}, errs.New(errs.NotFound, "node not found")
	}
	if err := checkRole(node.role, kind); err != nil {
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

func (s *Service) create(ctx context.Context, actor audit.Entry, module, nodeID, kind string, payload json.RawMessage, ttl time.Duration, batchID string) (Command, error) {
	if err := checkKind(kind, module); err != nil {
		return Command{}, err
	}
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	if len(payload) > MaxPayload {
		return Command{}, errs.New(errs.PayloadTooLarge, "payload: larger than 64 KiB")
	}
	if !json.Valid(payload) {
		return Command{}, errs.New(errs.InvalidInput, "payload: not valid JSON")
	}
	if ttl <= 0 {
		ttl = 10 * time.Minute
	}
	if ttl > 24*time.Hour {
		return Command{}, errs.New(errs.InvalidInput, "ttl: at most 24 hours")
	}
	node, err := s.nodeOf(ctx, nodeID)
	if err != nil {
		return Command{}, err
	}
	tenant := node.tenant
	if actor.TenantID != "root" && actor.TenantID != tenant {
		return Command{}, errs.New(errs.NotFound, "node not found")
	}
	if err := checkRole(node.role, kind); err != nil {
		return Command{}, err
	}
	refs, err := SecretRefs(payload)
	if err != nil {
		return Command{}, errs.Wrap(errs.InvalidInput, "payload: not valid JSON", err)
	}
	if module != "" && len(refs) > 0 {
		// A module's commands carry its callers' strings (a sandbox's
		// argv, a template's env) on a host of the root tenant: checking
		// those references against the host's tenant would answer a
		// tenant whether a fleet secret exists, and a live command naming
		// one would bind it to the host. No module command takes a
		// secret reference, so any is refused, one answer for all.
		return Command{}, errs.New(errs.InvalidInput, "payload: secret references are not allowed in this command")
	}
	if err := s.checkSecrets(ctx, tenant, refs); err != nil {
		return Command{}, err
	}
	now := s.clk.Now()
	c := Command{ID: ids.New("c"), NodeID: nodeID, TenantID: tenant, Kind: kind, Payload: payload, State: StateQueued,
		CreatedBy: actor.Actor, CreatedAt: now.UTC(), UpdatedAt: now.UTC(), ExpiresAt: now.Add(ttl).UTC(), BatchID: batchID}
	var batch any
	if batchID != "" {
		batch = batchID
	}
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if err := s.admitInFlight(ctx, tx, map[string]int64{tenant: 1}); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO commands (id, tenant_id, node_id, kind, payload, state, created_by, created_at, updated_at, expires_at, batch_id)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
			c.ID, tenant, nodeID, kind, []byte(payload), StateQueued, actor.Actor, now.UnixMilli(), now.UnixMilli(), c.ExpiresAt.UnixMilli(), batch); err != nil {
			return fmt.Errorf("commands: insert: %w", err)
		}
		sum := sha256.Sum256(payload)
		actor.TenantID = tenant
		actor.Action, actor.Resource, actor.Outcome = "compute:commands:create", "command/"+c.ID, "allowed"
		actor.Details = map[string]any{"node_id": nodeID, "kind": kind, "payload_sha256": fmt.Sprintf("%x", sum)}
		if batchID != "" {
			actor.Details["batch_id"] = batchID
		}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return Command{}, err
	}
	s.bus.Publish(bus.TopicSign)
	return c, nil
}

// MaxFanout bounds how many nodes one fan-out may address.
const MaxFanout = 10000

// CreateMany queues one command of kind for each of nodeIDs in a single
// transaction (each with its audit row), and wakes the signer once. Every
// node must belong to actor's tenant, unless actor is in the root tenant.
func (s *Service) CreateMany(ctx context.Context, actor audit.Entry, nodeIDs []string, kind string, payload json.RawMessage, ttl time.Duration) ([]Command, error) {
	if err := checkKind(kind, ""); err != nil {
		return nil, err
	}
	if len(nodeIDs) == 0 || len(nodeIDs) > MaxFanout {
		return nil, errs.New(errs.InvalidInput, "node_ids: between 1 and 10000 nodes")
	}
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	if len(payload) > MaxPayload || !json.Valid(payload) {
		return nil, errs.New(errs.InvalidInput, "payload: valid JSON of at most 64 KiB")
	}
	if ttl <= 0 {
		ttl = 10 * time.Minute
	}
	if ttl > 24*time.Hour {
		return nil, errs.New(errs.InvalidInput, "ttl: at most 24 hours")
	}
	refs, err := SecretRefs(payload)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidInput, "payload: not valid JSON", err)
	}
	// The nodes' tenants and roles are read, and every node checked, before
	// the transaction: a node's tenant and role never change, and the
	// secrets check runs on its own connection.
	records, err := nodeRecords(ctx, s.db, s.db.Dialect, nodeIDs)
	if err != nil {
		return nil, err
	}
	checked := map[string]bool{}
	for _, nodeID := range nodeIDs {
		r, ok := records[nodeID]
		if !ok || actor.TenantID != "root" && r.tenant != actor.TenantID {
			return nil, errs.New(errs.AccessDenied, "access denied")
		}
		if err := checkRole(r.role, kind); err != nil {
			return nil, err
		}
		if !checked[r.tenant] {
			checked[r.tenant] = true
			if err := s.checkSecrets(ctx, r.tenant, refs); err != nil {
				return nil, err
			}
		}
	}
	now := s.clk.Now()
	sum := sha256.Sum256(payload)
	out := make([]Command, 0, len(nodeIDs))
	seen := map[string]bool{}
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		for _, nodeID := range nodeIDs {
			if seen[nodeID] {
				continue
			}
			seen[nodeID] = true
			tenant := records[nodeID].tenant
			out = append(out, Command{ID: ids.New("c"), NodeID: nodeID, TenantID: tenant, Kind: kind, Payload: payload, State: StateQueued,
				CreatedBy: actor.Actor, CreatedAt: now.UTC(), UpdatedAt: now.UTC(), ExpiresAt: now.Add(ttl).UTC()})
		}
		if err := s.admitInFlight(ctx, tx, perTenant(out)); err != nil {
			return err
		}
		const perStmt = 500 // rows per INSERT: 5,000 bound values
		for chunk := range slices.Chunk(out, perStmt) {
			var q strings.Builder
			q.WriteString(`INSERT INTO commands (id, tenant_id, node_id, kind, payload, state, created_by, created_at, updated_at, expires_at) VALUES `)
			a := s.db.NewArgs()
			entries := make([]audit.Entry, 0, len(chunk))
			for i, c := range chunk {
				if i > 0 {
					q.WriteString(", ")
				}
				q.WriteString("(" + a.List(c.ID, c.TenantID, c.NodeID, kind, []byte(payload), StateQueued, actor.Actor, now.UnixMilli(), now.UnixMilli(), c.ExpiresAt.UnixMilli()) + ")")
				e := actor
				e.TenantID = c.TenantID
				e.Action, e.Resource, e.Outcome = "compute:commands:create", "command/"+c.ID, "allowed"
				e.Details = map[string]any{"node_id": c.NodeID, "kind": kind, "payload_sha256": fmt.Sprintf("%x", sum), "fanout": len(nodeIDs)}
				entries = append(entries, e)
			}
			if _, err := tx.ExecContext(ctx, q.String(), a.Values()...); err != nil {
				return fmt.Errorf("commands: insert: %w", err)
			}
			if err := audit.RecordMany(ctx, tx, s.db.Dialect, now, entries); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.bus.Publish(bus.TopicSign)
	return out, nil
}

// querier runs a query: a *sql.DB or a *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// nodeRecords returns the tenant and role of each node of ids that exists,
// one query per store.InChunk ids.
func nodeRecords(ctx context.Context, q querier, d store.Dialect, ids []string) (map[string]nodeRecord, error) {
	out := make(map[string]nodeRecord, len(ids))
	for chunk := range slices.Chunk(ids, store.InChunk) {
		a := store.NewArgsFor(d)
		rows, err := q.QueryContext(ctx, `SELECT id, tenant_id, role FROM nodes WHERE id IN (`+a.Strings(chunk)+`)`, a.Values()...)
		if err != nil {
			return nil, fmt.Errorf("commands: read node tenants: %w", err)
		}
		for rows.Next() {
			var id string
			var r nodeRecord
			if err := rows.Scan(&id, &r.tenant, &r.role); err != nil {
				rows.Close()
				return nil, fmt.Errorf("commands: scan node tenant: %w", err)
			}
			out[id] = r
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("commands: read node tenants: %w", err)
		}
	}
	return out, nil
}

// PendingNodes returns the nodes that have signed commands waiting to be
// sent. A gateway polls it once per interval, instead of once per session.
func (s *Service) PendingNodes(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT DISTINCT node_id FROM commands WHERE state = $1 AND body IS NOT NULL`, StateQueued)
	if err != nil {
		return nil, fmt.Errorf("commands: pending nodes: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("commands: scan pending node: %w", err)
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// ErrNotFound is returned for a command that does not exist.
var ErrNotFound = errs.New(errs.NotFound, "command not found")

// Get returns a command by id, NOT_FOUND when absent or outside tenant
// (unless tenant is root).
func (s *Service) Get(ctx context.Context, tenant, id string) (Command, error) {
	cs, err := s.query(ctx, `WHERE id = $1`, id)
	if err != nil {
		return Command{}, err
	}
	if len(cs) != 1 || tenant != "root" && cs[0].TenantID != tenant {
		return Command{}, ErrNotFound
	}
	return cs[0], nil
}

// Filter narrows List.
type Filter struct {
	NodeID string
	State  string
	Limit  int // default 100, at most 1000
}

// List returns tenant's commands (every command for root), newest first.
func (s *Service) List(ctx context.Context, tenant string, f Filter) ([]Command, error) {
	var where []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if tenant != "root" {
		add("tenant_id = $%d", tenant)
	}
	if f.NodeID != "" {
		add("node_id = $%d", f.NodeID)
	}
	if f.State != "" {
		add("state = $%d", f.State)
	}
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 100
	}
	q := ""
	if len(where) > 0 {
		q = "WHERE " + strings.Join(where, " AND ")
	}
	return s.query(ctx, q+fmt.Sprintf(" ORDER BY created_at DESC, id LIMIT %d", f.Limit), args...)
}

func (s *Service) query(ctx context.Context, where string, args ...any) ([]Command, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, node_id, tenant_id, kind, payload, state, attested, result, reason, created_by, created_at, updated_at, expires_at, batch_id
		FROM commands `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("commands: read: %w", err)
	}
	defer rows.Close()
	out := []Command{}
	for rows.Next() {
		var c Command
		var payload, result []byte
		var attested int
		var created, updated, expires int64
		var batch sql.NullString
		if err := rows.Scan(&c.ID, &c.NodeID, &c.TenantID, &c.Kind, &payload, &c.State, &attested, &result, &c.Reason,
			&c.CreatedBy, &created, &updated, &expires, &batch); err != nil {
			return nil, fmt.Errorf("commands: scan: %w", err)
		}
		c.BatchID = batch.String
		c.Payload = json.RawMessage(payload)
		c.Attested = attested == 1
		c.Result = asJSON(result)
		c.CreatedAt, c.UpdatedAt, c.ExpiresAt = time.UnixMilli(created).UTC(), time.UnixMilli(updated).UTC(), time.UnixMilli(expires).UTC()
		out = append(out, c)
	}
	return out, rows.Err()
}

// asJSON shows a result as JSON: itself when it is valid JSON, else a JSON
// string of its bytes; null when empty.
func asJSON(b []byte) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	if json.Valid(b) {
		return json.RawMessage(b)
	}
	q, _ := json.Marshal(string(b))
	return q
}

// TenantOf returns a command's tenant; NOT_FOUND when it does not exist.
func (s *Service) TenantOf(ctx context.Context, id string) (string, error) {
	var t string
	err := s.db.QueryRowContext(ctx, `SELECT tenant_id FROM commands WHERE id = $1`, id).Scan(&t)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("commands: tenant of: %w", err)
	}
	return t, nil
}

// PendingFor returns the signed, queued commands of nodeIDs, at most
// perNode of each node's oldest, in one query per store.InChunk nodes (a
// gateway fetches for all its sessions at once). A batched command carries
// its batch's approval and its leaf's inclusion proof beside the signed
// body.
func (s *Service) PendingFor(ctx context.Context, nodeIDs []string, perNode int) (map[string][]*nodev1.SignedCommand, error) {
	type batched struct {
		c                     *nodev1.SignedCommand
		nodeID, kind, batchID string
		payload               []byte
	}
	out := map[string][]*nodev1.SignedCommand{}
	var withBatch []batched
	for chunk := range slices.Chunk(nodeIDs, store.InChunk) {
		a := s.db.NewArgs()
		q := `SELECT node_id, id, body, signature, signer_cert, kind, payload, batch_id FROM (
			SELECT node_id, id, body, signature, signer_cert, kind, payload, batch_id,
				ROW_NUMBER() OVER (PARTITION BY node_id ORDER BY created_at, id) AS rn
			FROM commands WHERE state = ` + a.Add(StateQueued) + ` AND body IS NOT NULL AND node_id IN (` + a.Strings(chunk) + `)) q
			WHERE rn <= ` + a.Add(perNode) + ` ORDER BY node_id, rn`
		rows, err := s.db.QueryContext(ctx, q, a.Values()...)
		if err != nil {
			return nil, fmt.Errorf("commands: pending: %w", err)
		}
		for rows.Next() {
			c := &nodev1.SignedCommand{}
			var b batched
			var batch sql.NullString
			if err := rows.Scan(&b.nodeID, &c.Id, &c.Body, &c.Signature, &c.SignerCertDer, &b.kind, &b.payload, &batch); err != nil {
				rows.Close()
				return nil, fmt.Errorf("commands: scan pending: %w", err)
			}
			out[b.nodeID] = append(out[b.nodeID], c)
			if batch.Valid && batch.String != "" {
				b.c, b.batchID = c, batch.String
				withBatch = append(withBatch, b)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("commands: pending: %w", err)
		}
	}
	for _, b := range withBatch {
		if s.batches == nil {
			continue
		}
		// A failure leaves the command without approval or proof: the node
		// refuses it with the reason, which is what the operator sees.
		ap, pr, err := s.batches.Delivery(ctx, b.batchID, b.nodeID, b.kind, b.payload)
		if err != nil {
			s.log.Error("batch delivery", "command_id", b.c.Id, "batch_id", b.batchID, "err", err)
		}
		b.c.Approval, b.c.Proof = ap, pr
	}
	return out, nil
}

// MarkSent moves queued commands to sent, one statement per
// store.InChunk ids (a gateway reports what its sessions sent in batches).
func (s *Service) MarkSent(ctx context.Context, ids []string) error {
	now := s.clk.Now().UnixMilli()
	for chunk := range slices.Chunk(ids, store.InChunk) {
		a := s.db.NewArgs()
		q := `UPDATE commands SET state = ` + a.Add(StateSent) + `, updated_at = ` + a.Add(now) + ` WHERE state = ` + a.Add(StateQueued) + ` AND id IN (` + a.Strings(chunk) + `)`
		if _, err := s.db.ExecContext(ctx, q, a.Values()...); err != nil {
			return fmt.Errorf("commands: mark sent: %w", err)
		}
	}
	return nil
}

// ApplyUpdate records a node's CommandUpdate received on nodeID's session.
// The signed body and signature are stored verbatim; the result is attested
// only when the signature verifies against a certificate of this node that
// is not revoked, not of role node-tenant, and expired less than
// AttestGrace ago. It returns the state recorded.
func (s *Service) ApplyUpdate(ctx context.Context, nodeID string, upd *nodev1.CommandUpdate) (string, error) {
	r := s.ApplyUpdates(ctx, []UpdateItem{{NodeID: nodeID, Update: upd}})
	return r[0].State, r[0].Err
}

// UpdateItem and UpdateResult are the gateway's batch of updates and what
// was recorded for each (defined in package wire, which the gateway can
// import).
type (
	UpdateItem   = wire.UpdateItem
	UpdateResult = wire.UpdateResult
)

// ApplyUpdates records many updates (from many sessions) in one
// transaction, each exactly as ApplyUpdate would: a gateway batches them
// so a fan-out's results do not cost a transaction each.
func (s *Service) ApplyUpdates(ctx context.Context, items []UpdateItem) []UpdateResult {
	out := make([]UpdateResult, len(items))
	var ok []updateTodo
	for i, it := range items {
		var body nodev1.UpdateBody
		if err := proto.Unmarshal(it.Update.GetBody(), &body); err != nil {
			out[i].Err = errs.Wrap(errs.InvalidInput, "update body does not parse", err)
			continue
		}
		out[i].CommandID = body.CommandId
		if body.NodeId != it.NodeID {
			out[i].Err = errs.New(errs.AccessDenied, "update names another node")
			continue
		}
		switch body.State {
		case StateRunning, StateSucceeded, StateFailed, StateCancelled:
		default:
			out[i].Err = errs.New(errs.InvalidInput, "update state is not valid")
			continue
		}
		ok = append(ok, updateTodo{i: i, body: &body})
	}
	// Without the certificates nothing can be attested or refused: the
	// whole batch fails unacknowledged and the nodes send it again.
	if err := s.attestAll(ctx, items, ok); err != nil {
		for _, t := range ok {
			out[t.i].Err = err
		}
		return out
	}
	if len(ok) == 0 {
		return out
	}
	var changed []string
	now := s.clk.Now().UnixMilli()
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		changed = changed[:0]
		// One statement per round of at most 200 updates: a round trip per
		// update costs PostgreSQL far more than the write. A command named
		// twice in a batch (running, then its result) goes in two rounds,
		// in arrival order, since one UPDATE … FROM applies one row per
		// command.
		for _, round := range updateRounds(ok, 200) {
			applied, err := s.applyRound(ctx, tx, items, round, now)
			if err != nil {
				return err
			}
			for _, t := range round {
				it, body := items[t.i], t.body
				if applied[body.CommandId] {
					out[t.i].State = body.State
					changed = append(changed, body.CommandId)
					continue
				}
				// Unknown, another node's, or already final: nothing
				// changes. The node still gets an ack so it stops resending.
				var st string
				if err := tx.QueryRowContext(ctx, `SELECT state FROM commands WHERE id = $1 AND node_id = $2`, body.CommandId, it.NodeID).Scan(&st); err != nil {
					out[t.i].Err = errs.New(errs.NotFound, "command not found")
					continue
				}
				out[t.i].State = st
			}
		}
		return nil
	})
	if err != nil {
		for _, t := range ok {
			out[t.i].State, out[t.i].Err = "", err
		}
		return out
	}
	for _, id := range changed {
		s.bus.Publish(bus.CommandTopic(id))
	}
	return out
}

// updateRounds splits todo, in order, into rounds of at most size updates
// in which no command appears twice.
func updateRounds(todo []updateTodo, size int) [][]updateTodo {
	var rounds [][]updateTodo
	var cur []updateTodo
	inCur := map[string]bool{}
	for _, t := range todo {
		if len(cur) == size || inCur[t.body.CommandId] {
			rounds = append(rounds, cur)
			cur, inCur = nil, map[string]bool{}
		}
		cur = append(cur, t)
		inCur[t.body.CommandId] = true
	}
	if len(cur) > 0 {
		rounds = append(rounds, cur)
	}
	return rounds
}

// applyRound writes one round of updates (no command twice) in one
// statement and returns the ids of the commands it changed: those of the
// named node not already final.
func (s *Service) applyRound(ctx context.Context, tx *sql.Tx, items []UpdateItem, round []updateTodo, now int64) (map[string]bool, error) {
	a := s.db.NewArgs()
	var q strings.Builder
	q.WriteString(`WITH v(id, node_id, state, reason, result, attested, update_body, node_sig, serial) AS (VALUES `)
	for k, t := range round {
		it, body := items[t.i], t.body
		if k > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(" + a.Typed(body.CommandId, "text") + ", " + a.Typed(it.NodeID, "text") + ", " + a.Typed(body.State, "text") + ", " +
			a.Typed(body.Reason, "text") + ", " + a.Typed(body.Result, "bytea") + ", " + a.Typed(t.attested, "integer") + ", " +
			a.Typed(it.Update.Body, "bytea") + ", " + a.Typed(it.Update.NodeSig, "bytea") + ", " + a.Typed(it.Update.CertSerial, "text") + ")")
	}
	q.WriteString(`) UPDATE commands SET state = v.state, reason = v.reason, result = v.result, attested = v.attested, update_body = v.update_body,
		node_sig = v.node_sig, update_cert_serial = v.serial, updated_at = ` + a.Add(now) + `
		FROM v WHERE commands.id = v.id AND commands.node_id = v.node_id AND commands.state NOT IN (` + a.List(StateSucceeded, StateFailed, StateCancelled) + `)
		RETURNING commands.id`)
	rows, err := tx.QueryContext(ctx, q.String(), a.Values()...)
	if err != nil {
		return nil, fmt.Errorf("commands: apply updates: %w", err)
	}
	defer rows.Close()
	applied := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("commands: apply updates: %w", err)
		}
		applied[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("commands: apply updates: %w", err)
	}
	return applied, nil
}

// updateTodo is an update of a batch that passed the shape checks: its
// item's index, its parsed body, and whether its signature attests it.
type updateTodo struct {
	i        int
	body     *nodev1.UpdateBody
	attested int
}

// attestAll checks the node signatures of the updates in todo and sets
// each one's attested flag: one certificate query for the whole batch, and
// the signature checks spread over the CPUs, since a fan-out's results
// arrive together. It fails only when the certificates cannot be read.
func (s *Service) attestAll(ctx context.Context, items []UpdateItem, todo []updateTodo) error {
	if len(todo) == 0 {
		return nil
	}
	seen := map[string]bool{}
	var serials []string
	for k := range todo {
		if sn := items[todo[k].i].Update.GetCertSerial(); !seen[sn] {
			seen[sn] = true
			serials = append(serials, sn)
		}
	}
	states, err := s.certs.CertStates(ctx, serials)
	if err != nil {
		return fmt.Errorf("commands: read update certificates: %w", err)
	}
	cmdIDs := make([]string, 0, len(todo))
	for _, t := range todo {
		cmdIDs = append(cmdIDs, t.body.CommandId)
	}
	rows, err := s.bindings(ctx, cmdIDs)
	if err != nil {
		return err
	}
	now := s.clk.Now()
	workers := min(runtime.GOMAXPROCS(0), len(todo))
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := w; k < len(todo); k += workers {
				it := items[todo[k].i]
				attested, why := attest(states, rows, now, it.NodeID, it.Update, todo[k].body)
				if !attested {
					s.log.Warn("update not attested", "node_id", it.NodeID, "command_id", todo[k].body.CommandId, "why", why)
					continue
				}
				todo[k].attested = 1
			}
		}()
	}
	wg.Wait()
	return nil
}

// binding is what a signed update must name of its command: the node it
// is addressed to, its kind and the SHA-256 of its payload.
type binding struct {
	nodeID, kind string
	payloadSHA   [32]byte
}

// bindings reads the binding of each command of ids that exists, one query
// per store.InChunk ids.
func (s *Service) bindings(ctx context.Context, ids []string) (map[string]binding, error) {
	out := make(map[string]binding, len(ids))
	for chunk := range slices.Chunk(ids, store.InChunk) {
		a := s.db.NewArgs()
		rows, err := s.db.QueryContext(ctx, `SELECT id, node_id, kind, payload FROM commands WHERE id IN (`+a.Strings(chunk)+`)`, a.Values()...)
		if err != nil {
			return nil, fmt.Errorf("commands: read update bindings: %w", err)
		}
		for rows.Next() {
			var id string
			var b binding
			var payload []byte
			if err := rows.Scan(&id, &b.nodeID, &b.kind, &payload); err != nil {
				rows.Close()
				return nil, fmt.Errorf("commands: scan update binding: %w", err)
			}
			b.payloadSHA = sha256.Sum256(payload)
			out[id] = b
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("commands: read update bindings: %w", err)
		}
	}
	return out, nil
}

// attest checks the node's signature on an update against the stored
// record of the certificate it names: of this node, not revoked, not of
// role node-tenant, expired less than AttestGrace before now; and that the
// signed body names the kind and payload digest of the command row it
// reports on, so a result signed for one command never attests another.
func attest(states map[string]nodes.CertState, rows map[string]binding, now time.Time, nodeID string, upd *nodev1.CommandUpdate, body *nodev1.UpdateBody) (bool, string) {
	st, known := states[upd.CertSerial]
	row, haveRow := rows[body.CommandId]
	switch {
	case !haveRow || row.nodeID != nodeID:
		return false, "command-unknown"
	case body.Kind != row.kind:
		return false, "kind-mismatch"
	case !bytes.Equal(body.PayloadSha256, row.payloadSHA[:]):
		return false, "payload-mismatch"
	case !known:
		return false, "cert-unknown"
	case st.NodeID != nodeID:
		return false, "cert-other-node"
	case st.Revoked:
		return false, "cert-revoked"
	case st.Role == pki.RoleNodeTenant:
		return false, "node-tenant"
	case now.After(st.NotAfter.Add(AttestGrace)):
		return false, "cert-expired"
	}
	digest := sha256.Sum256(append([]byte(UpdateSigContext), upd.Body...))
	switch pub := st.Cert.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if ecdsa.VerifyASN1(pub, digest[:], upd.NodeSig) {
			return true, ""
		}
	case ed25519.PublicKey:
		if ed25519.Verify(pub, digest[:], upd.NodeSig) {
			return true, ""
		}
	}
	return false, "bad-signature"
}

// CancelDisallowed cancels nodeID's unfinished commands whose kind the
// certificate's role or allowed list does not permit (reason
// kind-not-allowed). The gateway calls it at Hello.
func (s *Service) CancelDisallowed(ctx context.Context, nodeID, role string, allowed []string) (int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, kind FROM commands WHERE node_id = $1 AND state IN ($2, $3, $4)`,
		nodeID, StateQueued, StateSent, StateRunning)
	if err != nil {
		return 0, fmt.Errorf("commands: list unfinished: %w", err)
	}
	var cancel []string
	for rows.Next() {
		var id, kind string
		if err := rows.Scan(&id, &kind); err != nil {
			rows.Close()
			return 0, fmt.Errorf("commands: scan unfinished: %w", err)
		}
		if !kinds.Permitted(role, allowed, kind) {
			cancel = append(cancel, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("commands: list unfinished: %w", err)
	}
	for _, id := range cancel {
		if _, err := s.db.ExecContext(ctx, `UPDATE commands SET state = $1, reason = $2, updated_at = $3 WHERE id = $4 AND state IN ($5, $6, $7)`,
			StateCancelled, "kind-not-allowed", s.clk.Now().UnixMilli(), id, StateQueued, StateSent, StateRunning); err != nil {
			return 0, fmt.Errorf("commands: cancel: %w", err)
		}
		s.bus.Publish(bus.CommandTopic(id))
	}
	return len(cancel), nil
}

// SentGrace is how long after its expiry a sent command waits for its
// result before the sweep cancels it. A node accepts a command only before
// its expiry, but one accepted just before may still be running: a node
// reports "running" only after a second (daemon.DefaultRunningAfter), so
// until then the command looks merely sent.
const SentGrace = time.Minute

// SweepExpired cancels unfinished commands past their expiry (reason
// expired): queued ones at once, sent ones after SentGrace. The workers
// role runs it.
func (s *Service) SweepExpired(ctx context.Context) (int64, error) {
	now := s.clk.Now()
	res, err := s.db.ExecContext(ctx, `UPDATE commands SET state = $1, reason = $2, updated_at = $3
		WHERE (state = $4 AND expires_at < $5) OR (state = $6 AND expires_at < $7)`,
		StateCancelled, "expired", now.UnixMilli(), StateQueued, now.UnixMilli(), StateSent, now.Add(-SentGrace).UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("commands: sweep: %w", err)
	}
	return res.RowsAffected()
}

// Attestation is an attested result as anyone can check it offline: the
// exact bytes the node signed (an UpdateBody naming the command's id,
// node, kind, payload digest and state), its signature over
// SHA-256(Context || SignedBody), and the node certificate that signed,
// PEM. The package attestation encodes it as a file and verifies it.
type Attestation struct {
	CommandID    string `json:"command_id"`
	Context      string `json:"context"`
	SignedBody   []byte `json:"signed_body"`
	Signature    []byte `json:"signature"`
	CertChainPEM string `json:"cert_chain_pem"`
}

// Attestation returns command id's attestation as tenant sees it:
// NOT_FOUND when the command is not in tenant's view, INVALID_STATE when
// its last update is not attested.
func (s *Service) Attestation(ctx context.Context, tenant, id string) (Attestation, error) {
	var owner string
	var attested int
	var body, sig []byte
	var serial sql.NullString
	err := s.db.QueryRowContext(ctx, `SELECT tenant_id, attested, update_body, node_sig, update_cert_serial FROM commands WHERE id = $1`, id).
		Scan(&owner, &attested, &body, &sig, &serial)
	if errors.Is(err, sql.ErrNoRows) || err == nil && tenant != "root" && tenant != owner {
		return Attestation{}, ErrNotFound
	}
	if err != nil {
		return Attestation{}, fmt.Errorf("commands: read attestation: %w", err)
	}
	if attested != 1 || len(body) == 0 || len(sig) == 0 || !serial.Valid {
		return Attestation{}, errs.New(errs.InvalidState, "the command has no attested result")
	}
	states, err := s.certs.CertStates(ctx, []string{serial.String})
	if err != nil {
		return Attestation{}, fmt.Errorf("commands: read attestation certificate: %w", err)
	}
	st, ok := states[serial.String]
	if !ok || st.Cert == nil {
		return Attestation{}, errs.New(errs.InvalidState, "the command has no attested result")
	}
	return Attestation{CommandID: id, Context: UpdateSigContext, SignedBody: body, Signature: sig, CertChainPEM: string(pki.CertPEM(st.Cert.Raw))}, nil
}
