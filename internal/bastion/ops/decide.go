package ops

import (
	"fmt"
	"time"
)

// How an op came to run, in its audit line.
const (
	byRead      = "read"
	byRootGrant = "root-grant"
	byApproval  = "approval"
	byStanding  = "standing"
)

// decide says whether op may run and how (byRead, byRootGrant, byApproval,
// byStanding), or refuses it. It is the table in the package doc, in order.
func (s *Server) decide(op Op) (string, error) {
	a := s.cfg.Approvals
	if op.Kind == KindRootRun || rootTerminal(op) {
		if !s.cfg.IsRoot() {
			return "", denied(ReasonNotRoot, "the bastion does not run as root")
		}
		if op.Kind == KindRootRun {
			if err := writesClosed(a); err != nil {
				return "", err
			}
			return byRootGrant, nil // Root.Run checks the grant given here
		}
	} else if op.Kind == KindTerminal && s.cfg.IsRoot() {
		// The bastion's user is root: its shell is a root shell, asked
		// for (and approved) as one.
		return "", denied(ReasonAskRoot, "the bastion runs as root: ask for a root terminal")
	}
	if !kinds[op.Kind].write {
		return byRead, nil
	}
	if err := writesClosed(a); err != nil {
		return "", err
	}
	if !a.Enrolled() {
		return "", denied(ReasonFactorNotEnrolled, EnrollHint)
	}
	extra, err := s.precheck(op)
	if err != nil {
		return "", err
	}
	digest := Digest(op.Kind, op.Canonical)
	if op.Approval != "" {
		if err := a.Spend(op.Approval, op.Kind, digest); err != nil {
			a.NoteRefusedWrite()
			return "", spendRefusal(err)
		}
		return byApproval, nil
	}
	if StandingKinds[op.Kind] && !a.Anchored() {
		err := a.UseStanding(op.Kind)
		if err == nil {
			return byStanding, nil
		}
		if refusalOf(err) == nil {
			return "", fmt.Errorf("ops: standing grant: %w", err)
		}
	}
	return "", s.ask(op, digest, extra)
}

// StandingKinds are the kinds a standing grant may run without a fresh
// approval: move plans and dry runs (which change nothing but a plan).
// Never an apply (it lands a change list someone must have seen), a
// terminal, or any write on an anchored machine, where every write needs
// an approval verified and spent here.
var StandingKinds = map[string]bool{KindFilesMove: true, KindDryRun: true}

// writesClosed refuses writes-locked while repeated refusals keep the
// pairing's writes closed.
func writesClosed(a Approvals) error {
	if until, locked := a.WritesLocked(); locked {
		return denied(ReasonWritesLocked, "writes are closed until "+until.UTC().Format(time.RFC3339))
	}
	return nil
}

// rootTerminal reports a terminal asked as root.
func rootTerminal(op Op) bool {
	t, ok := op.Args.(TerminalArgs)
	return ok && t.Root
}

// precheck runs the kind's own check before the person is asked, so a bad
// request never reaches them. It returns extra summary text (a plan's).
func (s *Server) precheck(op Op) (string, error) {
	switch a := op.Args.(type) {
	case MovePlanArgs:
		return "", s.cfg.Files.CheckMoves(a.Share, a.Moves)
	case DryRunArgs:
		return "", s.cfg.Actions.Check(a.Share, a)
	case ApplyArgs:
		return s.cfg.Actions.PlanSummary(a.Plan, a.Digest)
	}
	return "", nil
}

// spendRefusal is a refused Spend as ACCESS_DENIED with the approval
// store's reason; an error that is not a refusal is passed on.
func spendRefusal(err error) error {
	r := refusalOf(err)
	if r == nil {
		return fmt.Errorf("ops: spend approval: %w", err)
	}
	return denied(r.Reason, r.Detail)
}

// ask files an approval request and refuses APPROVAL_REQUIRED with it.
func (s *Server) ask(op Op, digest, extra string) error {
	summary := Summary(op.Kind, op.Args, extra)
	if len(summary) > MaxSummary {
		return denied(ReasonTooLarge, "the request is too long to show whole to the person")
	}
	id, expires, err := s.cfg.Approvals.Ask(op.Kind, digest, summary)
	if err != nil {
		if r := refusalOf(err); r != nil {
			return denied(r.Reason, r.Detail)
		}
		return fmt.Errorf("ops: ask approval: %w", err)
	}
	return &RefusedError{
		Code: CodeApprovalRequired, Reason: ReasonApprovalRequired,
		Detail:          "approve it on the machine: bcd bastion approve " + id,
		ApprovalRequest: id, ApprovalExpires: expires, Summary: summary,
	}
}
