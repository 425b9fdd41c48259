// Package tunnels is the module of interactive access through a node's
// own session: tunnels.open decides nothing itself (the API envelope
// decided compute:nodes:tunnel on the node for the caller) and issues a
// ticket, signed by the current worker key, single use, valid 60 s, for
// one node, one port and one action; Connect verifies the ticket again,
// has the gateway holding the node's session open the stream (the gateway
// and bcd each verify the ticket once more and spend its jti), and Serve
// carries the bytes between the client's connection and the node while
// re-deciding the caller's access, closing the tunnel when it is refused,
// when it cannot be decided for 2 minutes, or after 12 hours.
//
// Every ticket issued and every tunnel closed is an audit row.
package tunnels

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/ratelimit"
	"github.com/bettercompute/bettercompute/internal/revocations"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// Limits and intervals of tunnels.
const (
	// PerMinute is how many tickets one identity may get a minute (per
	// api process), then RATE_LIMITED with Retry-After.
	PerMinute = 10
	// RecheckEvery is how often an open tunnel's caller is re-decided
	// (its credential, its tenant's state, the node, the ticket's action).
	// The issue asks for at least every 60 s; a revoked key, identity or
	// binding, or a suspended tenant must close the tunnel within 5 s, and
	// until the revocation feed pushes revocations this interval is how.
	RecheckEvery = 2 * time.Second
	// FailFor is how long decisions may fail (IAM or the database
	// unreachable, not a refusal) before the tunnel closes.
	FailFor = 2 * time.Minute
	// MaxLife is the longest a tunnel stays open.
	MaxLife = 12 * time.Hour
	// MaxTicketText bounds a ticket as the client sends it (base64 of at
	// most tickets.MaxSize bytes).
	MaxTicketText = (tickets.MaxSize + 2) / 3 * 4
)

// Signer signs ticket bodies with the current worker key
// (signing.Signer).
type Signer interface {
	SignTicket(ctx context.Context, body *nodev1.TicketBody) (*nodev1.SignedTicket, error)
}

// Chunk is what a node stream gives at a time: data, the node's eof, or
// an exec's exit status (the last thing it sends).
type Chunk struct {
	Data []byte
	EOF  bool
	Exit *int32
}

// NodeStream is one tunnel's stream to a node (gateway.NodeStream).
type NodeStream interface {
	Recv() (Chunk, error)
	Send(data []byte) error
	CloseSend() error
	// Resize sends a terminal's new size (an exec's PTY).
	Resize(cols, rows uint16) error
	Close(reason string)
	Done() <-chan struct{}
}

// Target is what a tunnel goes to: a port on a node's loopback, or a
// program in a sandbox on a node (SandboxID set, Port 0), by Action.
type Target struct {
	NodeID    string
	Port      uint32
	SandboxID string
	Action    string
}

// Opener opens a tunnel through the node's session: the gateway, which
// verifies the ticket again and spends its jti.
type Opener interface {
	OpenTunnel(ctx context.Context, to Target, t *nodev1.SignedTicket) (NodeStream, error)
}

// Deps is what the module needs.
type Deps struct {
	DB     *store.DB
	Clock  clock.Clock
	Signer Signer
	// Verifier checks a presented ticket before the gateway is asked
	// (the command-signing roots and trust domain).
	Verifier *tickets.Verifier
	Log      *slog.Logger
}

// Service is the tunnels module.
type Service struct {
	d      Deps
	limits *ratelimit.PerKey

	mu     sync.Mutex
	opener Opener
	open   map[*Tunnel]struct{}
}

// New returns the module; SetOpener gives it the gateway.
func New(d Deps) *Service {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	return &Service{d: d, limits: ratelimit.New(d.Clock, PerMinute, time.Minute), open: map[*Tunnel]struct{}{}}
}

// SetOpener sets the gateway tunnels are opened through (the gateway of
// this process). Without one, Connect answers UNAVAILABLE.
func (s *Service) SetOpener(o Opener) {
	s.mu.Lock()
	s.opener = o
	s.mu.Unlock()
}

// Limiter is the limit of tickets per identity, PerMinute a minute,
// which the API enforces before Open runs (api.Method.LimitedPerIdentity).
func (s *Service) Limiter() *ratelimit.PerKey { return s.limits }

// LimitMessage is the refusal's safe message past Limiter's limit.
var LimitMessage = fmt.Sprintf("at most %d tunnels a minute per identity", PerMinute)

// Ticket is what tunnels.open answers.
type Ticket struct {
	// Ticket is the SignedTicket, marshalled and base64 (standard,
	// padded): the client presents it once to connect.
	Ticket    string
	JTI       string
	NodeID    string
	Port      uint32
	SandboxID string
	ExpiresAt time.Time
}

// Open issues a ticket for actor (whose Actor is the caller's identity
// and TenantID the node's tenant) to reach port on nodeID by action. The
// caller was decided (and limited, see Limiter) by the API envelope; Open
// records the issue in the audit log.
func (s *Service) Open(ctx context.Context, actor audit.Entry, nodeID string, port uint32, action string) (Ticket, error) {
	if port < 1 || port > 65535 {
		return Ticket{}, errs.New(errs.InvalidInput, "port: 1 to 65535")
	}
	if action != tickets.ActionNodeTunnel {
		return Ticket{}, errs.New(errs.InvalidInput, "action: not a tunnel action")
	}
	return s.issue(ctx, actor, &nodev1.TicketBody{NodeId: nodeID, Port: port, Action: action}, "node/"+nodeID)
}

// OpenExec issues a ticket for actor to run argv interactively in
// sandboxID on nodeID (the sandbox's node), decided
// compute:sandboxes:exec on the sandbox by the API envelope; it is
// recorded in the audit log with argv's digest, never argv.
func (s *Service) OpenExec(ctx context.Context, actor audit.Entry, sandboxID, nodeID string, argv []string) (Ticket, error) {
	body := &nodev1.TicketBody{NodeId: nodeID, SandboxId: sandboxID, Argv: argv, Action: tickets.ActionSandboxExec}
	return s.issue(ctx, actor, body, "sandbox/"+sandboxID)
}

// issue fills body's jti, caller, tenant and times, has it signed and
// records the issue under resource.
func (s *Service) issue(ctx context.Context, actor audit.Entry, body *nodev1.TicketBody, resource string) (Ticket, error) {
	now := s.d.Clock.Now()
	body.Jti, body.TenantId, body.Caller = newJTI(), actor.TenantID, actor.Actor
	body.IssuedAtMs, body.ExpiresAtMs = now.UnixMilli(), now.Add(tickets.Lifetime).UnixMilli()
	if body.Action == tickets.ActionSandboxExec && !tickets.ValidArgv(body.Argv) {
		return Ticket{}, errs.New(errs.InvalidInput, fmt.Sprintf("argv: 1 to %d arguments, the first not empty, each at most %d bytes without NUL", tickets.MaxArgv, tickets.MaxArg))
	}
	st, err := s.d.Signer.SignTicket(ctx, body)
	if err != nil {
		return Ticket{}, errs.Wrap(errs.Unavailable, "no worker key can sign a ticket now; try again shortly", err)
	}
	raw, err := proto.Marshal(st)
	if err != nil {
		return Ticket{}, fmt.Errorf("tunnels: encode ticket: %w", err)
	}
	actor.Action, actor.Resource, actor.Outcome = body.Action, resource, "allowed"
	actor.Details = map[string]any{"event": "ticket-issued", "jti": body.Jti, "expires_at_ms": body.ExpiresAtMs}
	if body.Port != 0 {
		actor.Details["port"] = body.Port
	}
	if len(body.Argv) > 0 {
		argvJSON, _ := json.Marshal(body.Argv)
		actor.Details["argc"], actor.Details["argv_sha256"] = len(body.Argv), fmt.Sprintf("%x", sha256.Sum256(argvJSON))
	}
	if err := s.d.DB.Tx(ctx, func(tx *sql.Tx) error { return audit.Record(ctx, tx, now, actor) }); err != nil {
		return Ticket{}, err
	}
	return Ticket{Ticket: base64.StdEncoding.EncodeToString(raw), JTI: body.Jti, NodeID: body.NodeId, Port: body.Port,
		SandboxID: body.SandboxId, ExpiresAt: time.UnixMilli(body.ExpiresAtMs)}, nil
}

// newJTI is 16 random bytes in hex.
func newJTI() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ReasonTicketSpent is the revocation feed's reason for a ticket whose
// tunnel opened.
const ReasonTicketSpent = "ticket-spent"

// ReasonWrongCaller: the ticket was issued to another identity or for
// another tenant than the caller presenting it.
const ReasonWrongCaller = "ticket-wrong-caller"

// ParseTicket decodes a ticket as the client sends it (base64 of a
// marshalled SignedTicket), bounded by MaxTicketText.
func ParseTicket(text string) (*nodev1.SignedTicket, error) {
	if len(text) > MaxTicketText {
		return nil, tickets.ReasonOversized.Err()
	}
	raw, err := base64.StdEncoding.DecodeString(text)
	if err != nil || len(raw) == 0 {
		return nil, tickets.ReasonMalformed.Err()
	}
	var st nodev1.SignedTicket
	if err := proto.Unmarshal(raw, &st); err != nil {
		return nil, tickets.ReasonMalformed.Err()
	}
	return &st, nil
}

// Connect opens the tunnel a ticket allows: the ticket must verify (for
// to's node, port or sandbox and action, fresh) and have been issued to
// actor's identity in actor's tenant; then the gateway verifies it again,
// spends its jti and asks the node, which verifies it once more. The
// tunnel is served with Serve.
func (s *Service) Connect(ctx context.Context, actor audit.Entry, to Target, ticket string) (*Tunnel, error) {
	st, err := ParseTicket(ticket)
	if err != nil {
		return nil, err
	}
	nodeID, port := to.NodeID, to.Port
	body, r := s.d.Verifier.VerifySigned(st, s.d.Clock.Now(), tickets.Want{NodeID: nodeID, Port: port, SandboxID: to.SandboxID, Actions: []string{to.Action}})
	if r != "" {
		return nil, r.Err()
	}
	if body.Caller != actor.Actor || body.TenantId != actor.TenantID {
		return nil, errs.New(errs.AccessDenied, "ticket refused: "+ReasonWrongCaller)
	}
	s.mu.Lock()
	o := s.opener
	s.mu.Unlock()
	if o == nil {
		return nil, errs.New(errs.Unavailable, "this api process serves no gateway; tunnels need the api and gateway roles in one process")
	}
	ns, err := o.OpenTunnel(ctx, to, st)
	if err != nil {
		return nil, err
	}
	// The spent jti goes into the revocation feed once the node took it,
	// so every node and follower learns it is used (an entry any earlier
	// could reach the node before the TunnelOpen and refuse it).
	now := s.d.Clock.Now()
	entry := revwire.Entry{Kind: revwire.KindTicket, Subject: body.Jti, TenantID: body.TenantId, NodeID: nodeID, At: now, Reason: ReasonTicketSpent}
	if err := s.d.DB.Tx(ctx, func(tx *sql.Tx) error { return revocations.AppendTx(ctx, tx, entry) }); err != nil {
		ns.Close("closed")
		return nil, errs.Wrap(errs.Unavailable, "the tunnel could not be recorded; try again", err)
	}
	t := &Tunnel{node: ns, actor: actor, jti: body.Jti, nodeID: nodeID, port: port, sandboxID: to.SandboxID, action: to.Action,
		opened: s.d.Clock.Now(), closed: make(chan struct{})}
	s.mu.Lock()
	s.open[t] = struct{}{}
	s.mu.Unlock()
	return t, nil
}

// Abandon closes a tunnel Connect opened that will not be served (its
// client went away before the upgrade).
func (s *Service) Abandon(t *Tunnel) {
	t.close(errClientGone)
	t.node.Close("closed")
	s.mu.Lock()
	delete(s.open, t)
	s.mu.Unlock()
}

// OpenCount is how many tunnels this process serves now.
func (s *Service) OpenCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.open)
}

// CloseAll closes every open tunnel (the process is stopping).
func (s *Service) CloseAll() {
	s.mu.Lock()
	all := make([]*Tunnel, 0, len(s.open))
	for t := range s.open {
		all = append(all, t)
	}
	s.mu.Unlock()
	for _, t := range all {
		t.close(errs.New(errs.Unavailable, "the control plane is stopping"))
	}
}

// errNoRecheck guards Serve against a missing decider.
var errNoRecheck = errors.New("tunnels: no recheck")
