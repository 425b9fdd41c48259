package ops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/netguard"
)

// Approvals is the machine's approval store (the approval package, through
// the lead's adapter).
type Approvals interface {
	// Enrolled reports a second factor enrolled on the machine.
	Enrolled() bool
	// Ask files a pending approval request bound to kind and digest.
	Ask(kind, digest, summary string) (id string, expires time.Time, err error)
	// Spend uses an approved request once; a refusal carries its reason.
	Spend(id, kind, digest string) error
	// UseStanding takes one run of a standing grant for kind.
	UseStanding(kind string) error
	// WritesLocked reports write lanes closed after refused writes.
	WritesLocked() (until time.Time, locked bool)
	// NoteRefusedWrite counts one refused write toward the lock.
	NoteRefusedWrite()
	// Anchored reports a machine a fleet owns.
	Anchored() bool
}

// Files serves the shared folders (the share package). List returns the
// entries (answered as {"entries": ...}), Stat one entry ({"entry": ...}),
// Read the file's bytes, ApplyMoves the whole result
// ({"moved": ..., "archive": ...}). An unknown share is a refusal.
type Files interface {
	List(share, path string) (any, error)
	Stat(share, path string) (any, error)
	Read(share, path string) ([]byte, error)
	CheckMoves(share string, moves []Move) error
	ApplyMoves(share string, moves []Move) (any, error)
}

// Actions runs action ops (the action package). Check is the arrival
// check of a dry run's terms; PlanSummary describes a plan for the person
// (and refuses an unknown plan or digest); DryRun returns the whole plan
// result; Apply returns the applied changes (answered as {"applied": ...}).
type Actions interface {
	Check(share string, a DryRunArgs) error
	DryRun(ctx context.Context, a DryRunArgs) (any, error)
	PlanSummary(plan, digest string) (string, error)
	Apply(ctx context.Context, a ApplyArgs) (any, error)
}

// Root runs a root command under the root grant given on the machine
// (the terminal package); it returns the whole result.
type Root interface {
	Run(ctx context.Context, argv []string) (any, error)
}

// Terminals serves an approved terminal on an upgraded connection.
type Terminals interface {
	Serve(ctx context.Context, conn io.ReadWriteCloser, session string, root bool) error
}

// Audit kinds written to Config.Audit.
const (
	// AuditOp: a well-formed op ran (or a terminal was authorised).
	AuditOp = "op"
	// AuditRefuse: a well-formed op was refused or failed.
	AuditRefuse = "op-refuse"
)

// Config configures a Server. Every field but Shares and Log is required.
type Config struct {
	Approvals Approvals
	Files     Files
	Actions   Actions
	Root      Root
	Terminals Terminals
	// Audit is the bastion's chain: every op run (AuditOp) and every
	// refusal of a well-formed op (AuditRefuse).
	Audit func(kind, reason, detail string)
	// Dialer carries observe:net's probes (built anchored or not).
	Dialer *netguard.Dialer
	// Shares lists the shared folders' paths, for observe:disk.
	Shares func() []string
	// IsRoot reports the bastion running as root.
	IsRoot func() bool
	Clock  clock.Clock
	Log    *slog.Logger
}

// Server is the bastion's op server. It holds no mutable state of its own.
type Server struct {
	cfg Config
	log *slog.Logger
}

// New checks cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Approvals == nil || cfg.Files == nil || cfg.Actions == nil || cfg.Root == nil ||
		cfg.Terminals == nil || cfg.Audit == nil || cfg.Dialer == nil || cfg.IsRoot == nil || cfg.Clock == nil {
		return nil, errors.New("ops: Config needs Approvals, Files, Actions, Root, Terminals, Audit, Dialer, IsRoot and Clock")
	}
	if cfg.Shares == nil {
		cfg.Shares = func() []string { return nil }
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: log}, nil
}

// Do validates op (a malformed op is refused INVALID_INPUT with no audit),
// decides whether it may run (see the package doc's table), and runs it.
// For KindTerminal it only decides: the caller serves the terminal. Every
// outcome of a well-formed op is audited.
func (s *Server) Do(ctx context.Context, op Op) (any, error) {
	op, err := newOp(op.ID, op.Kind, op.Args, op.Approval)
	if err != nil {
		return nil, err
	}
	how, err := s.decide(op)
	if err != nil {
		return nil, s.refused(op, err)
	}
	if op.Kind == KindTerminal {
		s.done(op, how)
		return nil, nil
	}
	res, err := s.run(ctx, op)
	if err != nil {
		return nil, s.refused(op, err)
	}
	s.done(op, how)
	return res, nil
}

// done audits and logs an op that ran.
func (s *Server) done(op Op, how string) {
	s.cfg.Audit(AuditOp, "", fmt.Sprintf("kind=%s op=%s by=%s", op.Kind, op.ID, how))
	s.log.Info("op done", "kind", op.Kind, "op", op.ID, "by", how)
}

// refused audits and logs a refusal (or failure) of a well-formed op and
// returns it as a *RefusedError, or err itself when it is not a refusal.
func (s *Server) refused(op Op, err error) error {
	r := refusalOf(err)
	if r == nil {
		s.cfg.Audit(AuditRefuse, ReasonInternal, fmt.Sprintf("kind=%s op=%s", op.Kind, op.ID))
		s.log.Error("op failed", "kind", op.Kind, "op", op.ID, "err", err)
		return err
	}
	detail := fmt.Sprintf("kind=%s op=%s", op.Kind, op.ID)
	if r.ApprovalRequest != "" {
		detail += " request=" + r.ApprovalRequest
	}
	s.cfg.Audit(AuditRefuse, r.Reason, detail)
	s.log.Info("op refused", "kind", op.Kind, "op", op.ID, "reason", r.Reason)
	return r
}
