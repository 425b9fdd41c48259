// Package nodes owns the fleet's identities: join tokens, nodes, their
// certificates and revocations, and the session registry with its
// duplicate-identity rules. It implements the Join and Renew services the
// gateway relays to, and holds the node CA key for that; the gateway itself
// holds no CA key.
package nodes

import (
	"context"
	"crypto"
	"crypto/x509"
	"database/sql"
	"encoding/json"
	"errors"
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
	"github.com/bettercompute/bettercompute/internal/jointoken"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/revocations"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Event types this module publishes.
const (
	EventJoinRefused      = "security.join.refused"
	EventRenewRefused     = "security.renew.refused"
	EventDuplicateSession = "security.node.duplicate-session"
	EventQuarantined      = "security.node.quarantined"
	EventJoined           = "node.joined"
)

// Revocation reasons.
const (
	ReasonDuplicateIdentity = "duplicate-identity"
	ReasonOperator          = "operator"
	ReasonSuperseded        = "superseded"
)

// Quarantine rule: more than FlipLimit alternations of one certificate
// between boots within FlipWindow revoke it.
const (
	FlipLimit  = 3
	FlipWindow = 10 * time.Minute
)

// DefaultRenewInterval is the least time between two renewals of one node:
// a node renews two thirds into its certificate's life (hours), so only a
// copy of its identity renews faster.
const DefaultRenewInterval = 5 * time.Minute

// Config is what the service needs from the PKI.
type Config struct {
	TrustDomain  string
	NodeCA       *x509.Certificate
	NodeCAKey    crypto.Signer
	CertLifetime time.Duration // default 24h
	// RenewInterval is the least time between two renewals of one node
	// (default DefaultRenewInterval); a faster one is refused
	// renew-rate-limited.
	RenewInterval time.Duration
	// Bundle is the join-key-signed trust bundle handed to joining nodes.
	BundleBody, BundleSig []byte
	JoinPublicKey         []byte
	// OtherSignatures sign BundleBody with the staged and previous join
	// keys while the join key rotates.
	OtherSignatures []pki.JoinSignature
	// JoinPin (the active join key's) goes into new join tokens;
	// AcceptedPins are the pins a join token may carry: every join key held
	// (active, staged, previous). Empty means JoinPin alone.
	JoinPin      [32]byte
	AcceptedPins [][32]byte
}

// Service is the nodes module.
type Service struct {
	db     *store.DB
	clk    clock.Clock
	events *audit.Events
	bus    *bus.Bus
	log    *slog.Logger
	cfg    Config
	quotas *quota.Service
}

// New returns the nodes module; quotas (required) admits join tokens: the
// server passes the configured service.
func New(db *store.DB, clk clock.Clock, events *audit.Events, b *bus.Bus, log *slog.Logger, quotas *quota.Service, cfg Config) *Service {
	if quotas == nil {
		panic("nodes: New needs a quota service")
	}
	if cfg.CertLifetime == 0 {
		cfg.CertLifetime = 24 * time.Hour
	}
	if cfg.RenewInterval == 0 {
		cfg.RenewInterval = DefaultRenewInterval
	}
	return &Service{db: db, clk: clk, events: events, bus: b, log: log, quotas: quotas, cfg: cfg}
}

// Node is a node as the API shows it.
type Node struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	TenantID   string            `json:"tenant_id"`
	Role       string            `json:"role"`
	Connected  bool              `json:"connected"`
	BootID     string            `json:"boot_id,omitempty"`
	Version    string            `json:"version,omitempty"`
	Labels     map[string]string `json:"labels"`
	Inventory  json.RawMessage   `json:"inventory"`
	CreatedAt  time.Time         `json:"created_at"`
	LastSeenAt *time.Time        `json:"last_seen_at,omitempty"`
	// State is what the node's certificates allow: StateActive,
	// StateRevoked, StateQuarantined or StateExpired.
	State string `json:"state"`
	// StateReason says why a node is not active: the last revocation's
	// reason (such as duplicate-identity or operator) or "certificate-expired".
	StateReason string `json:"state_reason,omitempty"`
}

// Node states, from the node's certificates.
const (
	StateActive      = "active"      // an unrevoked certificate is still valid
	StateRevoked     = "revoked"     // every certificate is revoked or expired, the last revoked
	StateQuarantined = "quarantined" // as revoked, the last for duplicate-identity
	StateExpired     = "expired"     // no certificate revoked or valid: re-join it
)

// certState derives a node's state from the latest expiry of its unrevoked
// certificates and the reason of its latest revocation.
func certState(now time.Time, validUntil sql.NullInt64, lastRevoke sql.NullString) (state, reason string) {
	switch {
	case validUntil.Valid && validUntil.Int64 > now.UnixMilli():
		return StateActive, ""
	case lastRevoke.Valid && lastRevoke.String == ReasonDuplicateIdentity:
		return StateQuarantined, lastRevoke.String
	case lastRevoke.Valid:
		return StateRevoked, lastRevoke.String
	}
	return StateExpired, "certificate-expired"
}

// CreatedToken is the one-time answer to a token creation: Token is shown
// once and never stored.
type CreatedToken struct {
	ID        string    `json:"id"`
	Token     string    `json:"token"`
	Role      string    `json:"role"`
	ExpiresAt time.Time `json:"expires_at"`
}

// TokenRole decides the certificate role of a join token a caller asks
// for. A caller in the root tenant mints for the platform's own machines:
// any role, node by default. A machine that any other tenant joins is
// tenant-controlled (the tenant holds root on it), so such a caller mints
// only role node-tenant, its default; any other role is INVALID_INPUT. A
// node-tenant certificate never gets a secret, never attests and never
// runs a destructive kind.
func TokenRole(callerIsRoot bool, role string) (string, error) {
	if role == "" {
		if callerIsRoot {
			return pki.RoleNode, nil
		}
		return pki.RoleNodeTenant, nil
	}
	if err := checkJoinRole(role); err != nil {
		return "", err
	}
	if !callerIsRoot && role != pki.RoleNodeTenant {
		return "", errs.New(errs.InvalidInput, "role: a machine a tenant other than root joins is tenant-controlled; its join token's role is node-tenant")
	}
	return role, nil
}

// ReasonBastionRole is the message of a join token asked for with role
// bastion: only the bastions module mints those (PairToken), after its own
// authorization decision (compute:bastions:pair).
const ReasonBastionRole = "role: a bastion's pairing token is made by bastions.pairToken, never as a join token"

// checkJoinRole refuses a role a join token may not carry: an unknown one,
// and bastion (INVALID_INPUT either way).
func checkJoinRole(role string) error {
	if role == pki.RoleBastion {
		return errs.New(errs.InvalidInput, ReasonBastionRole)
	}
	if !pki.ValidRole(role) {
		return errs.New(errs.InvalidInput, "role must be one of node, ramdisk, site, node-tenant")
	}
	return nil
}

// CreateJoinToken makes a single-use join token for role, valid for ttl,
// with its audit row in the same transaction. Role bastion is refused
// (INVALID_INPUT): see CreatePairToken.
func (s *Service) CreateJoinToken(ctx context.Context, actor audit.Entry, role, name string, ttl time.Duration) (CreatedToken, error) {
	if role == "" {
		role = pki.RoleNode
	}
	if err := checkJoinRole(role); err != nil {
		return CreatedToken{}, err
	}
	return s.createToken(ctx, actor, role, name, ttl, "compute:join-tokens:create")
}

// CreatePairToken makes a single-use join token of role bastion (a
// bastion's pairing token), valid for ttl, with its audit row (action
// compute:bastions:pair) in the same transaction. Only the bastions module
// calls it; the join itself is an ordinary Join with the same checks.
func (s *Service) CreatePairToken(ctx context.Context, actor audit.Entry, name string, ttl time.Duration) (CreatedToken, error) {
	return s.createToken(ctx, actor, pki.RoleBastion, name, ttl, "compute:bastions:pair")
}

// createToken makes one token of role, audited as action.
func (s *Service) createToken(ctx context.Context, actor audit.Entry, role, name string, ttl time.Duration, action string) (CreatedToken, error) {
	if ttl <= 0 {
		ttl = time.Hour
	}
	if ttl > 7*24*time.Hour {
		return CreatedToken{}, errs.New(errs.InvalidInput, "ttl must be at most 7 days")
	}
	if name != "" && !ValidateName(name) {
		return CreatedToken{}, errs.New(errs.InvalidInput, NameRule)
	}
	now := s.clk.Now()
	t := jointoken.Token{Pin: s.cfg.JoinPin, ID: ids.New("jt_"), Secret: ids.Secret(32)}
	exp := now.Add(ttl)
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		if err := s.admitTokens(ctx, tx, actor.TenantID, 1, 1, now); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlInsertToken, t.ID, actor.TenantID, jointoken.HashSecret(t.Secret), role, name, actor.Actor, now.UnixMilli(), exp.UnixMilli()); err != nil {
			return fmt.Errorf("nodes: insert token: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = action, "join-token/"+t.ID, "allowed"
		actor.Details = map[string]any{"role": role, "expires_at": exp.UnixMilli()}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return CreatedToken{}, err
	}
	return CreatedToken{ID: t.ID, Token: t.String(), Role: role, ExpiresAt: exp.UTC()}, nil
}

// CreateJoinTokens makes count single-use tokens for role (for fleets and
// the fleet simulator), at most MaxBulkTokens, in short transactions of
// TokenChunk tokens (see insertTokens), with one audit row.
func (s *Service) CreateJoinTokens(ctx context.Context, actor audit.Entry, role string, count int, ttl time.Duration) ([]CreatedToken, error) {
	if count < 1 || count > MaxBulkTokens {
		return nil, errs.New(errs.InvalidInput, "count: between 1 and 10000")
	}
	if role == "" {
		role = pki.RoleNode
	}
	if err := checkJoinRole(role); err != nil {
		return nil, err
	}
	if ttl <= 0 {
		ttl = time.Hour
	}
	if ttl > 7*24*time.Hour {
		return nil, errs.New(errs.InvalidInput, "ttl must be at most 7 days")
	}
	now := s.clk.Now()
	return s.insertTokens(ctx, actor, role, count, now, now.Add(ttl))
}

// refuse records a refused Join or Renew and returns the one generic error
// a node sees.
func (s *Service) refuse(ctx context.Context, typ, reason, nodeID string, details map[string]any) error {
	if _, err := s.events.Refused(ctx, typ, reason, nodeID, details); err != nil {
		s.log.Warn("record refusal", "type", typ, "reason", reason, "err", err)
	}
	return errs.New(errs.AccessDenied, "access denied")
}

// RecordRefusal records a refusal a transport decided (rate limited per
// reason); the caller has already answered with a generic error.
func (s *Service) RecordRefusal(ctx context.Context, typ, reason, nodeID string) {
	_ = s.refuse(ctx, typ, reason, nodeID, nil)
}

// TrustBundle returns the signed trust bundle: its body, the active join
// key's signature and public key, and the other join keys' signatures.
func (s *Service) TrustBundle() (body, sig, joinPub []byte, others []pki.JoinSignature) {
	return s.cfg.BundleBody, s.cfg.BundleSig, s.cfg.JoinPublicKey, s.cfg.OtherSignatures
}

// acceptedPins are the join-key pins a token may carry.
func (s *Service) acceptedPins() [][32]byte {
	if len(s.cfg.AcceptedPins) == 0 {
		return [][32]byte{s.cfg.JoinPin}
	}
	return s.cfg.AcceptedPins
}

// Join spends a token and certifies the CSR's key as a new node. Every
// refusal is one generic ACCESS_DENIED; the reason goes to the event log.
func (s *Service) Join(ctx context.Context, token string, csrDER []byte, name string) (nodeID string, chain [][]byte, err error) {
	t, parsed, reason := checkJoinRequest(token, s.acceptedPins(), name)
	if !parsed {
		return "", nil, s.refuse(ctx, EventJoinRefused, reason, "", nil)
	}
	if reason != "" {
		return "", nil, s.refuse(ctx, EventJoinRefused, reason, "", map[string]any{"token_id": t.ID})
	}
	now := s.clk.Now()
	nodeID = ids.New("n")
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		row, err := scanToken(tx.QueryRowContext(ctx, sqlReadToken, t.ID))
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("nodes: read token: %w", err)
		}
		if reason = decideJoin(row, err == nil, t.Secret, now); reason != "" {
			return errRefused
		}
		name = joinName(name, row.name, nodeID)
		if s.cfg.NodeCAKey == nil {
			return errs.New(errs.Internal, "this process holds no node CA key")
		}
		leaf, err := pki.IssueNodeCert(s.cfg.NodeCA, s.cfg.NodeCAKey, csrDER, s.cfg.TrustDomain, nodeID, row.role, s.cfg.CertLifetime, now)
		if err != nil {
			reason = reasonCSRInvalid
			return errRefused
		}
		chain = [][]byte{leaf}
		if reason, err = writeJoin(ctx, tx, t.ID, nodeID, name, row, leaf, now); err != nil {
			return err
		}
		// The event commits with the join: one commit a join, not two
		// (a commit waits for the disk), and no join without its event.
		return s.events.PublishTx(ctx, tx, EventJoined, nodeID, map[string]any{"name": name})
	})
	if errors.Is(err, errRefused) {
		return "", nil, s.refuse(ctx, EventJoinRefused, reason, "", map[string]any{"token_id": t.ID})
	}
	if err != nil {
		return "", nil, err
	}
	return nodeID, chain, nil
}

// writeJoin spends token tokenID for nodeID and records the node, its
// certificate leaf and the audit row. A token another join spent first
// refuses (errRefused with the reason).
func writeJoin(ctx context.Context, tx *sql.Tx, tokenID, nodeID, name string, tok tokenRow, leaf []byte, now time.Time) (string, error) {
	res, err := tx.ExecContext(ctx, sqlSpendToken, now.UnixMilli(), nodeID, tokenID)
	if err != nil {
		return "", fmt.Errorf("nodes: spend token: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return reasonTokenUsed, errRefused
	}
	if _, err := tx.ExecContext(ctx, sqlInsertNode, nodeID, tok.tenant, name, tok.role, now.UnixMilli()); err != nil {
		return "", fmt.Errorf("nodes: insert node: %w", err)
	}
	if err := insertCert(ctx, tx, nodeID, tok.role, leaf, now); err != nil {
		return "", err
	}
	return "", audit.Record(ctx, tx, now, audit.Entry{TenantID: tok.tenant, Actor: "node/" + nodeID, Action: "compute:nodes:join",
		Resource: "node/" + nodeID, Outcome: "allowed", Details: map[string]any{"token_id": tokenID, "role": tok.role, "name": name}})
}

var errRefused = errors.New("refused")

func insertCert(ctx context.Context, tx *sql.Tx, nodeID, role string, leaf []byte, now time.Time) error {
	cert, err := x509.ParseCertificate(leaf)
	if err != nil {
		return fmt.Errorf("nodes: parse issued cert: %w", err)
	}
	serial := pki.SerialHex(cert)
	_, err = tx.ExecContext(ctx, sqlInsertCert, serial, nodeID, role, leaf, cert.NotBefore.UnixMilli(), cert.NotAfter.UnixMilli(), now.UnixMilli())
	if err != nil {
		return fmt.Errorf("nodes: insert cert: %w", err)
	}
	return nil
}

// ReasonRenewProofInvalid is the refusal reason of a renewal whose proof of
// possession does not verify against the presenting certificate's key.
const ReasonRenewProofInvalid = "renew-proof-invalid"

// VerifyRenewProof reports whether proof is the signature by pub (the
// presenting certificate's key, ECDSA ASN.1 or Ed25519) over
// SHA-256(wire.RenewSigContext || csrDER).
func VerifyRenewProof(pub crypto.PublicKey, csrDER, proof []byte) bool {
	return len(proof) > 0 && wire.VerifyNode(pub, wire.RenewSigContext, csrDER, proof)
}

// CheckRenewProof refuses (ACCESS_DENIED, recorded as
// ReasonRenewProofInvalid in security.renew.refused) a renewal unless proof
// shows that the holder of leaf's key, the certificate id was read from,
// asks for csrDER. The node's chain is public (every gateway sees it), so
// only this proves that the node itself asks.
func (s *Service) CheckRenewProof(ctx context.Context, id pki.NodeIdentity, leaf *x509.Certificate, csrDER, proof []byte) error {
	if leaf == nil || pki.SerialHex(leaf) != id.Serial || !VerifyRenewProof(leaf.PublicKey, csrDER, proof) {
		return s.refuse(ctx, EventRenewRefused, ReasonRenewProofInvalid, id.NodeID, map[string]any{"serial": id.Serial})
	}
	return nil
}

// Renew certifies a new key for a node that authenticated with its current,
// valid certificate (checked by the caller's TLS layer and CertState) and
// proved that it asks (the caller's CheckRenewProof). The new certificate
// keeps the role and allowed kinds. The certificate's revocation is read
// again under the node's lock, so a renewal that races a quarantine never
// outlives it.
func (s *Service) Renew(ctx context.Context, id pki.NodeIdentity, csrDER []byte) ([][]byte, error) {
	st, err := s.CertState(ctx, id.Serial)
	if err != nil {
		return nil, s.refuse(ctx, EventRenewRefused, "cert-unknown", id.NodeID, map[string]any{"serial": id.Serial})
	}
	if st.Revoked {
		return nil, s.refuse(ctx, EventRenewRefused, "cert-revoked", id.NodeID, map[string]any{"serial": id.Serial})
	}
	if st.NodeID != id.NodeID {
		return nil, s.refuse(ctx, EventRenewRefused, "cert-node-mismatch", id.NodeID, map[string]any{"serial": id.Serial})
	}
	if s.cfg.NodeCAKey == nil {
		return nil, errs.New(errs.Internal, "this process holds no node CA key")
	}
	now := s.clk.Now()
	leaf, err := pki.IssueNodeCert(s.cfg.NodeCA, s.cfg.NodeCAKey, csrDER, s.cfg.TrustDomain, id.NodeID, st.Role, s.cfg.CertLifetime, now)
	if err != nil {
		return nil, s.refuse(ctx, EventRenewRefused, "csr-invalid", id.NodeID, nil)
	}
	var refusal string // decideRenew's, under the node's lock
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		// One renewal per node per RenewInterval, decided under the node's
		// lock so that concurrent renewals cannot all pass.
		if err := s.lockNode(ctx, tx, id.NodeID); err != nil {
			return err
		}
		// The revocation read above was before the lock: a quarantine (or
		// any revocation) that committed since must not be outlived by a
		// fresh certificate, so it is read again under the lock.
		var revokedAt sql.NullInt64
		if err := tx.QueryRowContext(ctx, sqlCertRevokedAt, id.Serial).Scan(&revokedAt); err != nil {
			return fmt.Errorf("nodes: reread certificate: %w", err)
		}
		var recent int
		if !revokedAt.Valid {
			if err := tx.QueryRowContext(ctx, sqlCountRecentRenewals,
				id.NodeID, renewWindowStart(now, s.cfg.RenewInterval).UnixMilli()).Scan(&recent); err != nil {
				return fmt.Errorf("nodes: count renewals: %w", err)
			}
		}
		if refusal = decideRenew(revokedAt.Valid, recent); refusal != "" {
			return errRefused
		}
		if err := insertCert(ctx, tx, id.NodeID, st.Role, leaf, now); err != nil {
			return err
		}
		cert, _ := x509.ParseCertificate(leaf)
		if _, err := tx.ExecContext(ctx, sqlChainRenewal, id.Serial, pki.SerialHex(cert)); err != nil {
			return fmt.Errorf("nodes: chain renewal: %w", err)
		}
		if st.AllowedKinds != nil {
			b, _ := json.Marshal(st.AllowedKinds)
			cert, _ := x509.ParseCertificate(leaf)
			if _, err := tx.ExecContext(ctx, sqlSetAllowedKinds, string(b), pki.SerialHex(cert)); err != nil {
				return fmt.Errorf("nodes: copy allowed kinds: %w", err)
			}
		}
		var tenant string
		if err := tx.QueryRowContext(ctx, sqlNodeTenant, id.NodeID).Scan(&tenant); err != nil {
			return fmt.Errorf("nodes: read node: %w", err)
		}
		return audit.Record(ctx, tx, now, audit.Entry{TenantID: tenant, Actor: "node/" + id.NodeID, Action: "compute:nodes:renew",
			Resource: "node/" + id.NodeID, Outcome: "allowed", Details: map[string]any{"previous_serial": id.Serial}})
	})
	if refusal != "" {
		return nil, s.refuse(ctx, EventRenewRefused, refusal, id.NodeID, map[string]any{"serial": id.Serial})
	}
	if err != nil {
		return nil, err
	}
	return [][]byte{leaf}, nil
}

// CertState is what the gateway needs to know of a certificate.
type CertState struct {
	Serial       string
	NodeID       string
	Role         string
	Revoked      bool
	RevokeReason string // "" unless revoked
	NotAfter     time.Time
	Cert         *x509.Certificate
	AllowedKinds []string // nil: the role's table alone
}

// ErrCertUnknown is returned by CertState for a serial never issued.
var ErrCertUnknown = errors.New("nodes: certificate unknown")

// CertState reads a certificate's record.
func (s *Service) CertState(ctx context.Context, serial string) (CertState, error) {
	st, err := scanCertState(s.db.QueryRowContext(ctx, sqlCertState, serial))
	if errors.Is(err, sql.ErrNoRows) {
		return CertState{}, ErrCertUnknown
	}
	return st, err
}

// CertStates reads the records of many certificates in one query per
// store.InChunk serials (the gateway attests a batch of updates at once).
// A serial never issued is absent from the map.
func (s *Service) CertStates(ctx context.Context, serials []string) (map[string]CertState, error) {
	out := make(map[string]CertState, len(serials))
	for chunk := range slices.Chunk(serials, store.InChunk) {
		a := s.db.NewArgs()
		rows, err := s.db.QueryContext(ctx, sqlCertStatesPrefix+a.Strings(chunk)+`)`, a.Values()...)
		if err != nil {
			return nil, fmt.Errorf("nodes: read certs: %w", err)
		}
		for rows.Next() {
			st, err := scanCertState(rows)
			if errors.Is(err, errUnparsable) {
				continue // a record that cannot be checked proves nothing: as if unknown
			}
			if err != nil {
				rows.Close()
				return nil, err
			}
			out[st.Serial] = st
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("nodes: read certs: %w", err)
		}
	}
	return out, nil
}

// SetAllowedKinds narrows a certificate to kinds (nil removes the narrowing).
// It takes effect at the node's next Hello, and moves the node's host
// generation up in the same transaction (see HostSection).
func (s *Service) SetAllowedKinds(ctx context.Context, actor audit.Entry, serial string, kinds []string) error {
	var v any
	if kinds != nil {
		b, _ := json.Marshal(kinds)
		v = string(b)
	}
	now := s.clk.Now()
	return s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, sqlSetAllowedKinds, v, serial)
		if err != nil {
			return fmt.Errorf("nodes: set allowed kinds: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.NotFound, "certificate not found")
		}
		if _, err := tx.ExecContext(ctx, sqlBumpHostGeneration, serial); err != nil {
			return fmt.Errorf("nodes: bump host generation: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:nodes:restrict", "cert/"+serial, "allowed"
		actor.Details = map[string]any{"allowed_kinds": kinds}
		return audit.Record(ctx, tx, now, actor)
	})
}

// Revoke revokes every unrevoked certificate of nodeID (or only serial,
// when given) and pokes the gateways to close their sessions. A serial
// must be a certificate of nodeID (ErrNotNodeCert otherwise, the same
// answer as for a serial never issued), and the audit row is written in
// the tenant that owns the node, whatever tenant the actor named.
func (s *Service) Revoke(ctx context.Context, actor audit.Entry, nodeID, serial, reason string) (int, error) {
	now := s.clk.Now()
	var n int64
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		var tenant string
		var err error
		if serial != "" {
			tenant, err = certOfNode(ctx, tx, nodeID, serial)
		} else {
			tenant, err = nodeTenant(ctx, tx, nodeID)
		}
		if err != nil {
			return err
		}
		q, args := sqlRevokeNodeCertsReturning, []any{now.UnixMilli(), reason, nodeID}
		if serial != "" {
			q, args = sqlRevokeNodeCertReturning, append(args, serial)
		}
		feed, err := revokeCerts(ctx, tx, now, tenant, reason, q, args...)
		if err != nil {
			return fmt.Errorf("nodes: revoke: %w", err)
		}
		n = int64(len(feed))
		actor.TenantID = tenant
		actor.Action, actor.Resource, actor.Outcome = "compute:nodes:revoke", "node/"+nodeID, "allowed"
		actor.Details = map[string]any{"serial": serial, "reason": reason, "revoked": n}
		if err := audit.Record(ctx, tx, now, actor); err != nil {
			return err
		}
		return revocations.AppendTx(ctx, tx, feed...)
	})
	if err != nil {
		return 0, err
	}
	s.bus.Publish(bus.TopicRevoked)
	return int(n), nil
}

// revokeCerts runs q, an UPDATE of node_certs that returns the serial and
// node of each certificate it revoked, and returns their revocation-feed
// entries (tenant, reason, at now), for the caller to append last in tx.
func revokeCerts(ctx context.Context, tx *sql.Tx, now time.Time, tenant, reason, q string, args ...any) ([]revwire.Entry, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []revwire.Entry
	for rows.Next() {
		e := revwire.Entry{Kind: revwire.KindNodeCert, TenantID: tenant, At: now, Reason: reason}
		if err := rows.Scan(&e.Subject, &e.NodeID); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// RevokedSince returns the serials revoked at or after since, and the time
// to ask from next. Gateways poll it, so a revocation reaches every gateway.
func (s *Service) RevokedSince(ctx context.Context, since time.Time) ([]string, time.Time, error) {
	rows, err := s.db.QueryContext(ctx, sqlRevokedSince, since.UnixMilli())
	if err != nil {
		return nil, since, fmt.Errorf("nodes: revoked since: %w", err)
	}
	defer rows.Close()
	var out []string
	next := since
	for rows.Next() {
		var serial string
		var at int64
		if err := rows.Scan(&serial, &at); err != nil {
			return nil, since, fmt.Errorf("nodes: scan revoked: %w", err)
		}
		out = append(out, serial)
		if t := time.UnixMilli(at); t.After(next) {
			next = t
		}
	}
	return out, next, rows.Err()
}

// List returns the nodes visible in scope (every node for the root
// tenant), in name order.
func (s *Service) List(ctx context.Context, scope iam.Scope) ([]Node, error) {
	a := s.db.NewArgs()
	q := nodeColumns + ` WHERE ` + scope.Filter(a, "n.tenant_id") + ` AND n.deleted_at IS NULL ORDER BY n.name, n.id`
	return s.query(ctx, q, a.Values()...)
}

// Labeled returns the nodes List returns with only their id, tenant and
// labels set: what a fan-out by labels selects on. It skips List's
// per-node session and certificate reads, which on PostgreSQL made a
// 10,000-node fan-out wait seconds for the listing.
func (s *Service) Labeled(ctx context.Context, scope iam.Scope) ([]Node, error) {
	a := s.db.NewArgs()
	q := sqlLabeledNodes + ` WHERE ` + scope.Filter(a, "n.tenant_id") + ` AND n.deleted_at IS NULL ORDER BY n.name, n.id`
	rows, err := s.db.QueryContext(ctx, q, a.Values()...)
	if err != nil {
		return nil, fmt.Errorf("nodes: list labels: %w", err)
	}
	defer rows.Close()
	out := []Node{}
	for rows.Next() {
		var n Node
		var labels string
		if err := rows.Scan(&n.ID, &n.TenantID, &labels); err != nil {
			return nil, fmt.Errorf("nodes: list labels: %w", err)
		}
		if err := json.Unmarshal([]byte(labels), &n.Labels); err != nil {
			return nil, fmt.Errorf("nodes: decode labels: %w", err)
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

func (s *Service) query(ctx context.Context, q string, args ...any) ([]Node, error) {
	st, err := s.db.Stmt(ctx, q)
	if err != nil {
		return nil, err
	}
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return nil, fmt.Errorf("nodes: list: %w", err)
	}
	defer rows.Close()
	out := []Node{}
	for rows.Next() {
		n, err := scanNode(rows, s.clk.Now())
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// Get returns one node; NOT_FOUND when it does not exist in scope.
func (s *Service) Get(ctx context.Context, scope iam.Scope, id string) (Node, error) {
	ns, err := s.query(ctx, sqlNodeByID, id)
	if err != nil {
		return Node{}, err
	}
	if len(ns) != 1 || !scope.Sees(ns[0].TenantID) {
		return Node{}, errs.New(errs.NotFound, "node not found")
	}
	return ns[0], nil
}

// TenantOf returns a node's tenant; NOT_FOUND when unknown.
func (s *Service) TenantOf(ctx context.Context, nodeID string) (string, error) {
	var t string
	err := s.db.QueryRowContext(ctx, sqlNodeTenant, nodeID).Scan(&t)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errs.New(errs.NotFound, "node not found")
	}
	if err != nil {
		return "", fmt.Errorf("nodes: tenant of: %w", err)
	}
	return t, nil
}

// TenantsOf returns the tenant of each node of nodeIDs that exists, in one
// query per store.InChunk ids (fan-out over many nodes); an unknown id is
// absent from the map.
func (s *Service) TenantsOf(ctx context.Context, nodeIDs []string) (map[string]string, error) {
	out := make(map[string]string, len(nodeIDs))
	for chunk := range slices.Chunk(nodeIDs, store.InChunk) {
		a := s.db.NewArgs()
		rows, err := s.db.QueryContext(ctx, sqlNodeTenantsPrefix+a.Strings(chunk)+`)`, a.Values()...)
		if err != nil {
			return nil, fmt.Errorf("nodes: tenants of: %w", err)
		}
		for rows.Next() {
			var id, tenant string
			if err := rows.Scan(&id, &tenant); err != nil {
				rows.Close()
				return nil, fmt.Errorf("nodes: tenants of: %w", err)
			}
			out[id] = tenant
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("nodes: tenants of: %w", err)
		}
	}
	return out, nil
}

// NameRule says in words what ValidateName accepts.
const NameRule = ids.NameRule

// ValidateName reports whether a node (or join-token) name is acceptable
// (ids.ValidName: bcd checks the same rule before it joins).
func ValidateName(name string) bool { return ids.ValidName(name) }

// HostSection is what a node's signed desired state says of its host: the
// certificate's role and allowed kinds (nil: the role's table alone) under
// the node's host generation, which goes up with every change of them.
type HostSection struct {
	NodeID       string
	Role         string
	AllowedKinds []string
	Generation   uint64
}

// HostSectionOf reads the host section of the node whose certificate is
// serial, in one statement (the generation and the kinds are of one
// snapshot, so a desired state never pairs new kinds with an old
// generation or the reverse). ErrCertUnknown for a serial never issued or
// a deleted node's.
func (s *Service) HostSectionOf(ctx context.Context, serial string) (HostSection, error) {
	var h HostSection
	var allowed sql.NullString
	var gen int64
	err := s.db.QueryRowContext(ctx, sqlHostSection, serial).Scan(&h.NodeID, &h.Role, &allowed, &gen)
	if errors.Is(err, sql.ErrNoRows) {
		return HostSection{}, ErrCertUnknown
	}
	if err != nil {
		return HostSection{}, fmt.Errorf("nodes: read host section: %w", err)
	}
	if allowed.Valid {
		if err := json.Unmarshal([]byte(allowed.String), &h.AllowedKinds); err != nil {
			return HostSection{}, fmt.Errorf("nodes: decode allowed kinds: %w", err)
		}
	}
	h.Generation = uint64(max(gen, 0))
	return h, nil
}
