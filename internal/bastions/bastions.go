// Package bastions is the control plane's side of a bastion: a person's own
// machine (bcd bastion) that pairs with the control plane, dials out and
// serves a few gated lanes inside a user-space WireGuard tunnel.
//
// A bastion is a node of role bastion (its id is the node id; the nodes
// module joins it on the same checks as any node). This module owns what is
// particular to it: its WireGuard public key and tunnel address (recorded at
// its first hello), its pairing state, the grants that say what the control
// plane may do on it (signed notes, internal/bastion/grant, verified on the
// machine under the key it pinned at pairing) and the control plane's own
// two bastion keys (the grant signing key and its WireGuard key), sealed
// under the key-encryption key. It refuses what it is not sure of: a node
// that is not a bastion, an unpaired bastion, a WireGuard key another
// bastion holds.
package bastions

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Pairing states of a bastion.
const (
	StatePaired   = "paired"   // joined; may say hello and receive grants
	StateUnpaired = "unpaired" // unpaired by an operator: refused for good
)

// ReasonUnpairedCert is the revocation reason of an unpaired bastion's
// certificates (nodes.Revoke), so its mutual-TLS session is refused.
const ReasonUnpairedCert = "bastion-unpaired"

// Refusal reasons: stable lowercase codes, in errors (Refusal.Reason) and
// in audit rows, never a secret.
const (
	ReasonNotBastion     = "not-a-bastion"          // no such node, a deleted one, or one of another role
	ReasonUnpaired       = "bastion-unpaired"       // the bastion was unpaired
	ReasonWGKeyMalformed = "wg-key-malformed"       // not a base64 Curve25519 public key, or all zero
	ReasonWGKeyInUse     = "wg-key-in-use"          // another bastion (or the control plane) holds that key
	ReasonNoAddress      = "tunnel-addresses-spent" // every address of the tunnel range is allocated
)

// Refusal is a refused call: Code for the transport, Reason one of the
// Reason constants. It unwraps to an *errs.Error, so errs.CodeOf and
// errs.SafeMessage read it as any coded error.
type Refusal struct {
	Code   errs.Code
	Reason string
	Detail string // safe to show: names what was wrong, never a secret
}

// Error returns the reason and detail.
func (r *Refusal) Error() string { return r.message() }

// Unwrap returns the coded error a transport shows.
func (r *Refusal) Unwrap() error { return errs.New(r.Code, r.message()) }

func (r *Refusal) message() string {
	if r.Detail == "" {
		return r.Reason
	}
	return r.Reason + ": " + r.Detail
}

// refuse returns a *Refusal.
func refuse(code errs.Code, reason, detail string) error {
	return &Refusal{Code: code, Reason: reason, Detail: detail}
}

// ReasonOf returns the Reason of a *Refusal in err's chain ("" when none).
func ReasonOf(err error) string {
	var r *Refusal
	if errors.As(err, &r) {
		return r.Reason
	}
	return ""
}

// Service is the bastions module.
type Service struct {
	db    *store.DB
	clk   clock.Clock
	kek   pki.KEK
	nodes *nodes.Service
	bus   *bus.Bus
	log   *slog.Logger

	// ops reaches bastions' ops servers (SetOpsDialer; nil: this process
	// does not run the lanes role).
	opsMu sync.RWMutex
	ops   OpsDialer
}

// New returns the bastions module. kek seals the control plane's bastion
// keys; n answers what a node is and mints pairing tokens; b (nil: none)
// carries the bus.TopicBastions poke after grants change or a bastion is
// unpaired.
func New(db *store.DB, clk clock.Clock, kek pki.KEK, n *nodes.Service, b *bus.Bus, log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{db: db, clk: clk, kek: kek, nodes: n, bus: b, log: log}
}

// poke tells the gateway and the lanes role that grants or pairings changed.
func (s *Service) poke() {
	if s.bus != nil {
		s.bus.Publish(bus.TopicBastions)
	}
}

// PairToken makes a bastion's one-time pairing token: a join token of role
// bastion in actor's tenant, valid for ttl (default one hour, at most
// seven days), with its audit row (compute:bastions:pair) in the same
// transaction. The token is shown once and never stored.
func (s *Service) PairToken(ctx context.Context, actor audit.Entry, name string, ttl time.Duration) (nodes.CreatedToken, error) {
	if name == "" {
		return nodes.CreatedToken{}, errs.New(errs.InvalidInput, "name is required")
	}
	return s.nodes.CreatePairToken(ctx, actor, name, ttl)
}

// bastionNode answers the tenant of node id when it is a live node of role
// bastion, else a Refusal (code, ReasonNotBastion).
func (s *Service) bastionNode(ctx context.Context, id string, code errs.Code) (string, error) {
	tr, err := s.nodes.TenantRoles(ctx, []string{id})
	if err != nil {
		return "", fmt.Errorf("bastions: read node: %w", err)
	}
	n, ok := tr[id]
	if !ok || n.Role != pki.RoleBastion {
		return "", refuse(code, ReasonNotBastion, "")
	}
	return n.Tenant, nil
}

// TenantOf resolves a bastion's tenant for the API envelope; NOT_FOUND for
// a missing node, a deleted one and a node that is not a bastion alike.
func (s *Service) TenantOf(ctx context.Context, id string) (string, error) {
	t, err := s.bastionNode(ctx, id, errs.NotFound)
	if ReasonOf(err) == ReasonNotBastion {
		return "", errs.New(errs.NotFound, "bastion not found")
	}
	return t, err
}

// adopt makes sure bastion node id has its row (paired, named as the node
// is) and returns the row. A node that is not a bastion is refused with
// code and ReasonNotBastion.
func (s *Service) adopt(ctx context.Context, id string, code errs.Code) (row, error) {
	tenant, err := s.bastionNode(ctx, id, code)
	if err != nil {
		return row{}, err
	}
	r, err := s.readRow(ctx, s.db.DB, id)
	if err == nil {
		return r, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return row{}, err
	}
	n, err := s.nodes.Get(ctx, iam.ScopeOf(tenant), id)
	if err != nil {
		return row{}, fmt.Errorf("bastions: read node: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, sqlAdopt, id, tenant, n.Name, s.clk.Now().UnixMilli()); err != nil {
		return row{}, fmt.Errorf("bastions: record bastion: %w", err)
	}
	return s.readRow(ctx, s.db.DB, id)
}

// Paired reports whether bastionID is a live bastion node that was not
// unpaired (a bastion that never said hello is paired). It writes nothing.
func (s *Service) Paired(ctx context.Context, bastionID string) (bool, error) {
	if _, err := s.bastionNode(ctx, bastionID, errs.AccessDenied); err != nil {
		if ReasonOf(err) == ReasonNotBastion {
			return false, nil
		}
		return false, err
	}
	r, err := s.readRow(ctx, s.db.DB, bastionID)
	if errors.Is(err, sql.ErrNoRows) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return r.state == StatePaired, nil
}
