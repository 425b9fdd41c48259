package bastions

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// TerminalRequest asks a bastion for a terminal: Session is the caller's
// id for it (ts_ and 20 base32 characters), which the person's approval
// is bound to; Root asks for a root shell; Approval is the approval
// request id the person approved on the machine ("" the first time).
type TerminalRequest struct {
	Session  string
	Root     bool
	Approval string
}

// CheckTerminal refuses (INVALID_INPUT) a malformed terminal request. It
// is pure.
func CheckTerminal(req TerminalRequest) error {
	if !sessionRE.MatchString(req.Session) {
		return refuse(errs.InvalidInput, ReasonSessionID, "session: ts_ and 20 base32 characters")
	}
	if req.Approval != "" && !approvalRE.MatchString(req.Approval) {
		return refuse(errs.InvalidInput, ReasonApprovalID, "approval: apr_ and 20 base32 characters")
	}
	return nil
}

// ApprovalMessage is the message of the APPROVAL_REQUIRED answer to a
// terminal request.
func ApprovalMessage(approval, session string) string {
	return "the bastion asks its person: run `bcd bastion approve " + approval + "` on that machine, then repeat with --session " +
		session + " --approval " + approval
}

// OpenTerminal asks bastionID (seen by scope, paired) for a terminal: GET
// /v1/terminal with Upgrade: bc-term-v1 on its ops server. On 101 it
// returns the connection, which then carries the PTY's bytes both ways;
// an approval request is APPROVAL_REQUIRED (ApprovalMessage); a refusal
// or no answer is mapped as for ops. The request and the answer are
// audited (compute:bastions:terminal).
func (s *Service) OpenTerminal(ctx context.Context, actor audit.Entry, scope iam.Scope, bastionID string, req TerminalRequest) (net.Conn, error) {
	if err := CheckTerminal(req); err != nil {
		return nil, err
	}
	tenant, d, err := s.opTarget(ctx, scope, bastionID)
	if err != nil {
		return nil, err
	}
	details := map[string]any{"session": req.Session, "root": req.Root, "approval": req.Approval} // archtest:not-tenant (the query's root flag)
	const action = "compute:bastions:terminal"
	if err := s.record(ctx, actor, tenant, action, bastionID, "allowed", details); err != nil {
		return nil, err
	}
	conn, status, err := s.openTerminal(ctx, d, bastionID, req)
	s.recordAnswer(ctx, actor, tenant, action, bastionID, details, status, err)
	return conn, err
}

// openTerminal sends the terminal request and reads the bastion's answer:
// the upgraded connection (status "opened"), or an error.
func (s *Service) openTerminal(ctx context.Context, d OpsDialer, bastionID string, req TerminalRequest) (net.Conn, string, error) {
	q := url.Values{"session": {req.Session}, "root": {"0"}} // archtest:not-tenant (the query's root flag)
	if req.Root {
		q.Set("root", "1") // archtest:not-tenant (the query's root flag)
	}
	if req.Approval != "" {
		q.Set("approval", req.Approval)
	}
	hr, err := http.NewRequest(http.MethodGet, "http://bastion"+TerminalPath+"?"+q.Encode(), nil)
	if err != nil {
		return nil, "", errs.Wrap(errs.Internal, "encode the terminal request", err)
	}
	hr.Header.Set("Connection", "Upgrade")
	hr.Header.Set("Upgrade", TerminalProtocol)
	ex, err := s.exchange(ctx, d, bastionID, hr)
	if err != nil {
		return nil, "", err
	}
	if ex.resp.StatusCode == http.StatusSwitchingProtocols {
		if !strings.EqualFold(ex.resp.Header.Get("Upgrade"), TerminalProtocol) {
			ex.close()
			return nil, "", errNoAnswer
		}
		if c := ex.upgraded(); c != nil {
			return c, "opened", nil
		}
		return nil, "", errNoAnswer
	}
	defer ex.close()
	raw, err := ex.body(MaxOpAnswer)
	if err != nil {
		return nil, "", errNoAnswer
	}
	a, err := readAnswer(ex.resp.StatusCode, raw)
	switch {
	case err != nil:
		return nil, "", err
	case a.OK:
		return nil, "", errNoAnswer
	}
	return nil, OpApprovalRequired, errs.New(errs.ApprovalRequired, ApprovalMessage(a.ApprovalRequest, req.Session))
}
