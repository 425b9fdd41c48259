// Package breakglass is the control plane's break-glass SSH module: it
// signs short OpenSSH user certificates for one account on one node with
// the break-glass CA (package sshca), records each serial (table
// ssh_certs) with an audit row in the same transaction, limits each
// identity to RateLimit certificates an hour, revokes serials, and delivers
// each node's break-glass state (the CA, the accounts, the revoked serials)
// as a module-owned ssh.access command whose generation the node never goes
// back from. nodes.sshKrl answers the KRL of the last state the node
// reported applied.
package breakglass

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/ratelimit"
	"github.com/bettercompute/bettercompute/internal/revocations"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/sshca"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Actions the module's methods are decided by. Revocation has its own
// action, so that a role may end break-glass access without granting it.
const (
	ActionIssue  = "compute:nodes:ssh-root"
	ActionRevoke = "compute:nodes:ssh-revoke"
)

// RateLimit certificates per identity per RatePeriod; the next is
// RATE_LIMITED with a Retry-After.
const (
	RateLimit  = 20
	RatePeriod = time.Hour
)

// Limiter is the limit of certificates per identity, RateLimit per
// RatePeriod, which the API enforces before Issue runs
// (api.Method.LimitedPerIdentity).
func (s *Service) Limiter() *ratelimit.PerKey { return s.limit }

// LimitMessage is the refusal's safe message past Limiter's limit.
var LimitMessage = fmt.Sprintf("%s: at most %d certificates an hour per identity", ReasonRateLimited, RateLimit)

// ReasonRateLimited starts the safe message of a refused 21st certificate.
const ReasonRateLimited = "ssh-rate-limited"

// AccessTTL is how long a queued ssh.access command may wait for its node.
const AccessTTL = 24 * time.Hour

// Nodes is what the module reads of the fleet (the nodes module).
type Nodes interface {
	TenantRoles(ctx context.Context, ids []string) (map[string]nodes.TenantRole, error)
}

// Service is the break-glass module.
type Service struct {
	db    *store.DB
	clk   clock.Clock
	cmds  *commands.Service
	nodes Nodes
	ca    ssh.Signer
	limit *ratelimit.PerKey
	log   *slog.Logger
	// onRevoked is called after each committed revocation (OnRevoked).
	onRevoked func()
}

// OnRevoked sets f, called after each revocation this module commits (the
// server pokes the revocation feed's signer and followers with it). Set
// it before serving.
func (s *Service) OnRevoked(f func()) { s.onRevoked = f }

// ReasonRevokedByOperator is the revocation feed's reason for a serial
// revoked by nodes.revokeSshCert.
const ReasonRevokedByOperator = "operator"

// New returns the module signing with caKey (the bundle's break-glass SSH
// CA). A nil caKey makes a module whose issue answers INVALID_CONFIG.
func New(db *store.DB, clk clock.Clock, cmds *commands.Service, n Nodes, caKey ed25519.PrivateKey, log *slog.Logger) (*Service, error) {
	s := &Service{db: db, clk: clk, cmds: cmds, nodes: n, limit: ratelimit.New(clk, RateLimit, RatePeriod), log: log}
	if caKey != nil {
		signer, err := ssh.NewSignerFromKey(caKey)
		if err != nil {
			return nil, fmt.Errorf("breakglass: CA key: %w", err)
		}
		s.ca = signer
	}
	return s, nil
}

// IssueIn is nodes.issueSshCert's input.
type IssueIn struct {
	NodeID          string `json:"node_id" api:"max=64"`
	Account         string `json:"account" api:"max=32"`
	PublicKey       string `json:"public_key" api:"max=8192"`
	ValiditySeconds int64  `json:"validity_seconds,omitempty" api:"min=0,max=3600"`
}

// Issued is nodes.issueSshCert's answer.
type Issued struct {
	Certificate string    `json:"certificate"` // an authorized_keys line: "<type>-cert-v01@openssh.com base64 ..."
	Serial      string    `json:"serial"`      // decimal (a uint64 does not fit a JSON number every client reads exactly)
	Principal   string    `json:"principal"`
	ValidAfter  time.Time `json:"valid_after"`
	ValidBefore time.Time `json:"valid_before"`
	// CommandID is the ssh.access command that delivers the node's new
	// state ("" when its state already let the account in).
	CommandID string `json:"command_id,omitempty"`
}

// RevokeIn is nodes.revokeSshCert's input.
type RevokeIn struct {
	NodeID string `json:"node_id" api:"max=64"`
	Serial string `json:"serial" api:"max=20"` // decimal, as Issued.Serial
}

// Revoked is nodes.revokeSshCert's answer.
type Revoked struct {
	Serial         string `json:"serial"`
	AlreadyRevoked bool   `json:"already_revoked"`
	CommandID      string `json:"command_id,omitempty"`
}

// KRLIn is nodes.sshKrl's input.
type KRLIn struct {
	NodeID string `json:"node_id" api:"max=64"`
}

// KRLOut is nodes.sshKrl's answer: the KRL as the node has it.
type KRLOut struct {
	KRL        []byte   `json:"krl"` // OpenSSH KRL bytes (base64 in JSON)
	Generation uint64   `json:"generation"`
	CommandID  string   `json:"command_id"`
	Revoked    []string `json:"revoked"` // decimal serials
}

// Issue signs a certificate for in on behalf of the caller whose
// credential expires at credential (zero: never): actor.TenantID must be
// the node's tenant (the API resolved it; another tenant's node is
// NOT_FOUND). It records the serial and the audit row in one transaction,
// then queues the node's new state when it changed.
func (s *Service) Issue(ctx context.Context, actor audit.Entry, credential time.Time, in IssueIn) (Issued, error) {
	if s.ca == nil {
		return Issued{}, errs.New(errs.InvalidConfig, sshca.ReasonCAInvalid+": no break-glass CA configured")
	}
	key, err := sshca.ParsePublicKey([]byte(in.PublicKey))
	if err != nil {
		return Issued{}, err
	}
	if !sshca.ValidAccount(in.Account) {
		return Issued{}, errs.New(errs.InvalidInput, sshca.ReasonAccountInvalid+": account must match ^[a-z_][a-z0-9_-]{0,31}$")
	}
	now := s.clk.Now()
	end, err := notAfter(now, in.ValiditySeconds, credential)
	if err != nil {
		return Issued{}, err
	}
	if _, err := s.node(ctx, actor.TenantID, in.NodeID); err != nil {
		return Issued{}, err
	}
	serial, err := newSerial()
	if err != nil {
		return Issued{}, err
	}
	cert, err := sshca.Issue(s.ca, sshca.Request{PublicKey: []byte(in.PublicKey), Account: in.Account, NodeID: in.NodeID, Serial: serial, NotAfter: end}, now)
	if err != nil {
		return Issued{}, err
	}
	fp := ssh.FingerprintSHA256(key)
	after, before := time.Unix(int64(cert.ValidAfter), 0).UTC(), time.Unix(int64(cert.ValidBefore), 0).UTC()
	var state *sshca.Access
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, sqlInsertCert, int64(serial), actor.TenantID, in.NodeID, in.Account, actor.Actor, fp,
			now.UnixMilli(), after.UnixMilli(), before.UnixMilli()); err != nil {
			return fmt.Errorf("breakglass: insert certificate: %w", err)
		}
		a := actor
		a.Action, a.Resource, a.Outcome = ActionIssue, "node/"+in.NodeID, "allowed"
		a.Details = map[string]any{"serial": strconv.FormatUint(serial, 10), "account": in.Account, "principal": cert.ValidPrincipals[0],
			"key_fingerprint": fp, "valid_after": after.Unix(), "valid_before": before.Unix()}
		if err := audit.Record(ctx, tx, now, a); err != nil {
			return err
		}
		state, err = s.nextState(ctx, tx, actor.TenantID, in.NodeID, now, false)
		return err
	})
	if err != nil {
		return Issued{}, err
	}
	out := Issued{Certificate: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(cert))), Serial: strconv.FormatUint(serial, 10),
		Principal: cert.ValidPrincipals[0], ValidAfter: after, ValidBefore: before}
	out.CommandID = s.deliver(ctx, actor, state)
	return out, nil
}

// Revoke revokes serial, issued for nodeID in actor's tenant, records the
// audit row and queues the node's new state (also when it was already
// revoked, so a lost delivery can be sent again).
func (s *Service) Revoke(ctx context.Context, actor audit.Entry, in RevokeIn) (Revoked, error) {
	serial, err := strconv.ParseUint(in.Serial, 10, 63)
	if err != nil || serial == 0 || strconv.FormatUint(serial, 10) != in.Serial {
		return Revoked{}, errs.New(errs.InvalidInput, ReasonSerialInvalid+": serial must be a decimal from 1 to 2^63-1")
	}
	if _, err := s.node(ctx, actor.TenantID, in.NodeID); err != nil {
		return Revoked{}, err
	}
	now := s.clk.Now()
	out := Revoked{Serial: in.Serial}
	var state *sshca.Access
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		var tenant string
		err := tx.QueryRowContext(ctx, sqlCertOfNode, int64(serial), in.NodeID).Scan(&tenant, &out.AlreadyRevoked)
		if errors.Is(err, sql.ErrNoRows) || err == nil && tenant != actor.TenantID {
			return errs.New(errs.NotFound, ReasonSerialUnknown+": no certificate of that serial for the node")
		}
		if err != nil {
			return fmt.Errorf("breakglass: read certificate: %w", err)
		}
		if _, err := tx.ExecContext(ctx, sqlRevokeCert, now.UnixMilli(), actor.Actor, int64(serial)); err != nil {
			return fmt.Errorf("breakglass: revoke: %w", err)
		}
		a := actor
		a.Action, a.Resource, a.Outcome = ActionRevoke, "node/"+in.NodeID, "allowed"
		a.Details = map[string]any{"serial": in.Serial, "already_revoked": out.AlreadyRevoked}
		if err := audit.Record(ctx, tx, now, a); err != nil {
			return err
		}
		if state, err = s.nextState(ctx, tx, actor.TenantID, in.NodeID, now, true); err != nil || out.AlreadyRevoked {
			return err
		}
		// Last in the transaction (it takes the feed's counter): the
		// serial goes to the node over its session at once, ahead of the
		// ssh.access state of this generation that lists it.
		e := revwire.Entry{Kind: revwire.KindSSHCert, Subject: in.Serial, TenantID: actor.TenantID, NodeID: in.NodeID, At: now, Reason: ReasonRevokedByOperator}
		if state != nil {
			e.Generation = state.Generation
		}
		return revocations.AppendTx(ctx, tx, e)
	})
	if err != nil {
		return Revoked{}, err
	}
	if !out.AlreadyRevoked && s.onRevoked != nil {
		s.onRevoked()
	}
	out.CommandID = s.deliver(ctx, actor, state)
	return out, nil
}

// KRL returns the KRL of the last state the node reported applied (its
// ssh.access command succeeded); NOT_FOUND when it applied none.
func (s *Service) KRL(ctx context.Context, scope iam.Scope, nodeID string) (KRLOut, error) {
	rows, err := s.db.QueryContext(ctx, sqlQueuedStates, nodeID)
	if err != nil {
		return KRLOut{}, fmt.Errorf("breakglass: read states: %w", err)
	}
	type queued struct{ cmd, payload string }
	var qs []queued
	for rows.Next() {
		var q queued
		if err := rows.Scan(&q.cmd, &q.payload); err != nil {
			rows.Close()
			return KRLOut{}, fmt.Errorf("breakglass: scan state: %w", err)
		}
		qs = append(qs, q)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return KRLOut{}, fmt.Errorf("breakglass: read states: %w", err)
	}
	for _, q := range qs {
		c, err := s.cmds.Get(ctx, scope, q.cmd)
		if errors.Is(err, commands.ErrNotFound) {
			continue
		}
		if err != nil {
			return KRLOut{}, err
		}
		if c.State != wire.StateSucceeded {
			continue
		}
		a, ca, err := sshca.DecodeAccess([]byte(q.payload))
		if err != nil {
			return KRLOut{}, errs.Wrap(errs.Internal, "a stored break-glass state does not decode", err)
		}
		b, err := a.KRL(ca).Marshal()
		if err != nil {
			return KRLOut{}, err
		}
		revoked := make([]string, len(a.Revoked))
		for i, r := range a.Revoked {
			revoked[i] = strconv.FormatUint(r, 10)
		}
		return KRLOut{KRL: b, Generation: a.Generation, CommandID: q.cmd, Revoked: revoked}, nil
	}
	return KRLOut{}, errs.New(errs.NotFound, "ssh-krl-none: the node has applied no break-glass state yet")
}

// CA returns the break-glass CA's public key (nil when none).
func (s *Service) CA() ssh.PublicKey {
	if s.ca == nil {
		return nil
	}
	return s.ca.PublicKey()
}

// node checks that nodeID exists in tenant and runs ssh.access.
func (s *Service) node(ctx context.Context, tenant, nodeID string) (nodes.TenantRole, error) {
	rs, err := s.nodes.TenantRoles(ctx, []string{nodeID})
	if err != nil {
		return nodes.TenantRole{}, err
	}
	r, ok := rs[nodeID]
	if !ok || r.Tenant != tenant {
		return nodes.TenantRole{}, errs.New(errs.NotFound, "node not found")
	}
	if !kinds.AllowedForRole(r.Role, kinds.SSHAccess) {
		return nodes.TenantRole{}, errs.New(errs.InvalidInput, ReasonNodeRole+": break-glass SSH is for nodes of role node")
	}
	return r, nil
}

// nextState makes the node's state in tx, after the change the
// transaction made, and records it under the next generation when it must
// be delivered (needsDelivery); nil when it need not. The node's
// ssh_access_gen row is locked first, so concurrent changes of one node
// get generations in the order their states were read.
func (s *Service) nextState(ctx context.Context, tx *sql.Tx, tenant, nodeID string, now time.Time, revoked bool) (*sshca.Access, error) {
	if _, err := tx.ExecContext(ctx, sqlEnsureGen, nodeID); err != nil {
		return nil, fmt.Errorf("breakglass: generation row: %w", err)
	}
	if _, err := tx.ExecContext(ctx, sqlLockGen, nodeID); err != nil {
		return nil, fmt.Errorf("breakglass: lock generation: %w", err)
	}
	var last *sshca.Access
	var payload string
	switch err := tx.QueryRowContext(ctx, sqlLastAccess, nodeID).Scan(&payload); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return nil, fmt.Errorf("breakglass: last state: %w", err)
	default:
		a, _, err := sshca.DecodeAccess([]byte(payload))
		if err != nil {
			return nil, errs.Wrap(errs.Internal, "a stored break-glass state does not decode", err)
		}
		last = &a
	}
	accounts, err := readStrings(ctx, tx, sqlLiveAccounts, nodeID, now.UnixMilli())
	if err != nil {
		return nil, err
	}
	if !needsDelivery(last, accounts, revoked) {
		return nil, nil
	}
	serials, err := readSerials(ctx, tx, sqlRevokedLive, nodeID, now.UnixMilli())
	if err != nil {
		return nil, err
	}
	var gen int64
	if err := tx.QueryRowContext(ctx, sqlNextGen, nodeID).Scan(&gen); err != nil {
		return nil, fmt.Errorf("breakglass: next generation: %w", err)
	}
	a := sshca.Access{Generation: uint64(gen), NodeID: nodeID, CA: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.ca.PublicKey()))),
		Accounts: accounts, Revoked: serials, IssuedAt: now.Unix()}
	b, err := a.Marshal()
	if err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, sqlInsertState, nodeID, gen, tenant, string(b), now.UnixMilli()); err != nil {
		return nil, fmt.Errorf("breakglass: insert state: %w", err)
	}
	return &a, nil
}

// deliver queues state (nil: nothing) as an ssh.access command and
// records its id; it returns the id, or "" when nothing was queued. A
// failure is logged, not returned: the certificate or revocation is
// recorded, and the next change queues a newer state.
func (s *Service) deliver(ctx context.Context, actor audit.Entry, state *sshca.Access) string {
	if state == nil {
		return ""
	}
	payload, err := state.Marshal()
	if err == nil {
		var c commands.Command
		c, err = s.cmds.CreateOwned(ctx, kinds.ModuleBreakGlass, audit.Entry{TenantID: actor.TenantID, Actor: "breakglass:" + actor.Actor,
			RequestID: actor.RequestID, Caller: actor.Caller}, state.NodeID, kinds.SSHAccess, payload, AccessTTL)
		if err == nil {
			if _, err = s.db.ExecContext(ctx, sqlSetCommand, c.ID, state.NodeID, int64(state.Generation)); err == nil {
				return c.ID
			}
		}
	}
	s.log.Warn("break-glass state not queued", "node_id", state.NodeID, "generation", state.Generation, "err", err)
	return ""
}

// newSerial returns a random serial in 1 to 2^63-1 (the table's BIGINT).
func newSerial() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("breakglass: serial: %w", err)
		}
		if s := binary.BigEndian.Uint64(b[:]) >> 1; s != 0 {
			return s, nil
		}
	}
}

// readStrings reads one text column of q's rows.
func readStrings(ctx context.Context, tx *sql.Tx, q string, args ...any) ([]string, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("breakglass: query: %w", err)
	}
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("breakglass: scan: %w", err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// readSerials reads one BIGINT column of q's rows as serials.
func readSerials(ctx context.Context, tx *sql.Tx, q string, args ...any) ([]uint64, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("breakglass: query: %w", err)
	}
	defer rows.Close()
	out := []uint64{}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("breakglass: scan: %w", err)
		}
		out = append(out, uint64(v))
	}
	return out, rows.Err()
}
