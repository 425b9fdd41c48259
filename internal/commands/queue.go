package commands

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
)

// ErrNotFound is returned for a command that does not exist.
var ErrNotFound = errs.New(errs.NotFound, "command not found")

// Get returns a command by id; NOT_FOUND when absent or not visible in
// scope.
func (s *Service) Get(ctx context.Context, scope iam.Scope, id string) (Command, error) {
	c, ok, err := s.store.get(ctx, id)
	if err != nil {
		return Command{}, err
	}
	if !ok || !scope.Sees(c.TenantID) {
		return Command{}, ErrNotFound
	}
	return c, nil
}

// Filter narrows List.
type Filter struct {
	NodeID string
	// State is a state as the caller gave it ("": any); a string that is
	// no state is refused (INVALID_INPUT).
	State string
	// FanoutID keeps the commands of one fan-out ("": any).
	FanoutID string
	Limit    int // default 100, at most 1000
}

// List returns the commands visible in scope (every command for the root
// tenant) that match f, newest first; a state that is none of the six is
// INVALID_INPUT.
func (s *Service) List(ctx context.Context, scope iam.Scope, f Filter) ([]Command, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	return s.store.list(ctx, scope, f.normalized())
}

// FanoutSummary returns how many of fan-out id's commands visible in scope
// are in each state; NOT_FOUND when none is.
func (s *Service) FanoutSummary(ctx context.Context, scope iam.Scope, id string) (map[wire.State]int, error) {
	if id == "" {
		return nil, errs.New(errs.InvalidInput, "fanout_id is required")
	}
	counts, err := s.store.fanoutStates(ctx, scope, id)
	if err != nil {
		return nil, err
	}
	if len(counts) == 0 {
		return nil, errs.New(errs.NotFound, "fan-out not found")
	}
	return counts, nil
}

// TenantOf returns a command's tenant; NOT_FOUND when it does not exist.
func (s *Service) TenantOf(ctx context.Context, id string) (string, error) {
	t, ok, err := s.store.tenantOf(ctx, id)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", ErrNotFound
	}
	return t, nil
}

// PendingNodes returns the nodes that have signed commands waiting to be
// sent. A gateway polls it once per interval, instead of once per session.
func (s *Service) PendingNodes(ctx context.Context) ([]string, error) {
	return s.store.pendingNodes(ctx)
}

// PendingFor returns the signed, queued commands of nodeIDs, at most
// perNode of each node's oldest, in one query per store.InChunk nodes (a
// gateway fetches for all its sessions at once). A batched command carries
// its batch's approval and its leaf's inclusion proof beside the signed
// body.
func (s *Service) PendingFor(ctx context.Context, nodeIDs []string, perNode int) (map[string][]*nodev1.SignedCommand, error) {
	out := map[string][]*nodev1.SignedCommand{}
	for chunk := range slices.Chunk(nodeIDs, store.InChunk) {
		rows, err := s.store.pending(ctx, chunk, perNode)
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			c := &nodev1.SignedCommand{Id: r.id, Body: r.body, Signature: r.sig, SignerCertDer: r.signerCert}
			out[r.nodeID] = append(out[r.nodeID], c)
			if r.batchID != "" {
				s.attachDelivery(ctx, c, r)
			}
		}
	}
	return out, nil
}

// attachDelivery sets the approval and inclusion proof of batched command
// c. A failure leaves the command without them: the node refuses it with
// the reason, which is what the operator sees.
func (s *Service) attachDelivery(ctx context.Context, c *nodev1.SignedCommand, r pendingRow) {
	ap, pr, err := s.batches.Delivery(ctx, r.batchID, r.nodeID, r.kind, r.payload)
	if err != nil {
		s.log.Error("batch delivery", "command_id", c.Id, "batch_id", r.batchID, "err", err)
	}
	c.Approval, c.Proof = ap, pr
}

// MarkSent moves queued commands to sent, one statement per
// store.InChunk ids (a gateway reports what its sessions sent in batches).
func (s *Service) MarkSent(ctx context.Context, ids []string) error {
	return s.retry.Do(ctx, func() error { return s.store.markSent(ctx, ids, s.clk.Now()) })
}

// CancelDisallowed cancels nodeID's unfinished commands whose kind the
// certificate's role or allowed list does not permit (reason
// kind-not-allowed). The gateway calls it at Hello.
func (s *Service) CancelDisallowed(ctx context.Context, nodeID, role string, allowed []string) (int, error) {
	unfinished, err := s.store.unfinished(ctx, nodeID)
	if err != nil {
		return 0, err
	}
	cancel := disallowed(role, allowed, unfinished)
	for _, id := range cancel {
		if err := s.store.cancel(ctx, id, "kind-not-allowed", s.clk.Now()); err != nil {
			return 0, err
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
	var n int64
	err := s.retry.Do(ctx, func() error {
		var err error
		n, err = s.store.sweep(ctx, now, now.Add(-SentGrace))
		return err
	})
	return n, err
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

// errNoAttestation answers a command whose last update is not attested.
var errNoAttestation = errs.New(errs.InvalidState, "the command has no attested result")

// Attestation returns command id's attestation as scope sees it:
// NOT_FOUND when the command is not visible in scope, INVALID_STATE when
// its last update is not attested.
func (s *Service) Attestation(ctx context.Context, scope iam.Scope, id string) (Attestation, error) {
	row, ok, err := s.store.attestation(ctx, id)
	if err != nil {
		return Attestation{}, err
	}
	if !ok || !scope.Sees(row.tenant) {
		return Attestation{}, ErrNotFound
	}
	if !row.attested || len(row.body) == 0 || len(row.sig) == 0 || !row.serial.Valid {
		return Attestation{}, errNoAttestation
	}
	states, err := s.nodes.CertStates(ctx, []string{row.serial.String})
	if err != nil {
		return Attestation{}, fmt.Errorf("commands: read attestation certificate: %w", err)
	}
	st, ok := states[row.serial.String]
	if !ok || st.Cert == nil {
		return Attestation{}, errNoAttestation
	}
	return Attestation{CommandID: id, Context: UpdateSigContext, SignedBody: row.body, Signature: row.sig, CertChainPEM: string(pki.CertPEM(st.Cert.Raw))}, nil
}
