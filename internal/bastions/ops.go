package bastions

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"regexp"
	"time"
	"unicode/utf8"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// The ops wire (issue 19): the bastion's ops server inside its tunnel,
// one HTTP/1.1 request per connection.
const (
	OpsPath          = "/v1/op"
	TerminalPath     = "/v1/terminal"
	TerminalProtocol = "bc-term-v1"
	// OpTimeout bounds a whole op (dial, request, answer) and a terminal's
	// opening, on the module's clock.
	OpTimeout = 60 * time.Second
	// MaxOpAnswer bounds an op's answer body; a longer one is no answer.
	MaxOpAnswer = 8 << 20
	// MaxOpArgs bounds an op's arguments (a JSON object).
	MaxOpArgs = 256 << 10
	// MaxOpKind bounds an op kind's length.
	MaxOpKind = 64
	// MaxSummary bounds the summary of an approval request.
	MaxSummary = 64 << 10
)

// An op's status in OpAnswer.
const (
	OpDone             = "done"              // the bastion ran it; Result is its answer
	OpApprovalRequired = "approval-required" // the person must approve it on the machine first
)

// Reasons an op or terminal request is refused before any dial
// (INVALID_INPUT).
const (
	ReasonOpKind     = "op-kind"          // not ^[a-z]+:[a-z-]+$, or over MaxOpKind
	ReasonOpArgs     = "op-args"          // not a JSON object, or over MaxOpArgs
	ReasonApprovalID = "approval-id"      // not apr_ and 20 base32 characters
	ReasonSessionID  = "terminal-session" // not ts_ and 20 base32 characters
)

var (
	opKindRE     = regexp.MustCompile(`^[a-z]+:[a-z-]+$`)
	wireReasonRE = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)
	approvalRE   = regexp.MustCompile(`^apr_[a-z2-7]{20}$`)
	sessionRE    = regexp.MustCompile(`^ts_[a-z2-7]{20}$`)
	lowerB32     = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)
)

// OpsDialer opens a connection to a bastion's ops server through its
// tunnel (the lanes role's DialOps).
type OpsDialer interface {
	DialOps(ctx context.Context, bastionID string) (net.Conn, error)
}

// SetOpsDialer sets what ops and terminals dial (the server wiring, when
// this process runs the lanes role).
func (s *Service) SetOpsDialer(d OpsDialer) {
	s.opsMu.Lock()
	defer s.opsMu.Unlock()
	s.ops = d
}

// errNoLanes answers an op in a process without the lanes role.
var errNoLanes = errs.New(errs.Unavailable, "this process does not run the lanes role")

// OpAnswer is what bastions.op answers: the op's result, or the approval
// request the person must approve on the machine before the same op is
// sent again with Approval set.
type OpAnswer struct {
	Status          string          `json:"status"`
	Kind            string          `json:"kind"`
	OpID            string          `json:"op_id"`
	Result          json.RawMessage `json:"result,omitempty"`
	ApprovalRequest string          `json:"approval_request,omitempty"`
	ApprovalExpires *time.Time      `json:"approval_expires,omitempty"`
	Summary         string          `json:"summary,omitempty"`
}

// CheckOp refuses (INVALID_INPUT) a malformed op before anything is
// dialled: a kind not of the wire's shape, arguments that are not one
// JSON object of at most MaxOpArgs, an approval id not of its shape. The
// bastion checks the kind's own schema. It is pure.
func CheckOp(kind string, args json.RawMessage, approval string) error {
	if len(kind) > MaxOpKind || !opKindRE.MatchString(kind) {
		return refuse(errs.InvalidInput, ReasonOpKind, "kind: such as observe:disk or files:read")
	}
	t := bytes.TrimSpace(args)
	if len(args) > MaxOpArgs || len(t) == 0 || t[0] != '{' || !json.Valid(t) {
		return refuse(errs.InvalidInput, ReasonOpArgs, "args: one JSON object of at most 256 KiB")
	}
	if approval != "" && !approvalRE.MatchString(approval) {
		return refuse(errs.InvalidInput, ReasonApprovalID, "approval: apr_ and 20 base32 characters")
	}
	return nil
}

// wireOp is the body of POST /v1/op.
type wireOp struct {
	OpID     string          `json:"op_id"`
	Kind     string          `json:"kind"`
	Args     json.RawMessage `json:"args"`
	Approval string          `json:"approval,omitempty"`
}

// Op sends an op to bastionID, which scope must see (NOT_FOUND as a
// missing one otherwise) and which must be paired (INVALID_STATE), and
// maps the bastion's answer: done, approval-required (not an error), a
// refusal (INVALID_INPUT, ACCESS_DENIED, NOT_FOUND with the bastion's
// reason) or UNAVAILABLE. An audit row (compute:bastions:op, allowed) is
// written before the op is sent and one with the answer after.
func (s *Service) Op(ctx context.Context, actor audit.Entry, scope iam.Scope, bastionID, kind string, args json.RawMessage, approval string) (OpAnswer, error) {
	if err := CheckOp(kind, args, approval); err != nil {
		return OpAnswer{}, err
	}
	tenant, d, err := s.opTarget(ctx, scope, bastionID)
	if err != nil {
		return OpAnswer{}, err
	}
	w := wireOp{OpID: "op_" + randomB32(16), Kind: kind, Args: json.RawMessage(bytes.TrimSpace(args)), Approval: approval}
	sum := sha256.Sum256(w.Args)
	details := map[string]any{"op_id": w.OpID, "kind": kind, "args_sha256": hex.EncodeToString(sum[:]), "approval": approval}
	if err := s.record(ctx, actor, tenant, "compute:bastions:op", bastionID, "allowed", details); err != nil {
		return OpAnswer{}, err
	}
	ans, err := s.sendOp(ctx, d, bastionID, w)
	s.recordAnswer(ctx, actor, tenant, "compute:bastions:op", bastionID, details, ans.Status, err)
	return ans, err
}

// opTarget resolves bastionID in scope, requires it paired and returns its
// tenant and the ops dialer.
func (s *Service) opTarget(ctx context.Context, scope iam.Scope, bastionID string) (string, OpsDialer, error) {
	r, err := s.visible(ctx, scope, bastionID)
	if err != nil {
		return "", nil, err
	}
	if r.state != StatePaired {
		return "", nil, refuse(errs.InvalidState, ReasonUnpaired, "the bastion is unpaired")
	}
	s.opsMu.RLock()
	d := s.ops
	s.opsMu.RUnlock()
	if d == nil {
		return "", nil, errNoLanes
	}
	return r.tenant, d, nil
}

// sendOp posts w to the bastion and maps its answer.
func (s *Service) sendOp(ctx context.Context, d OpsDialer, bastionID string, w wireOp) (OpAnswer, error) {
	body, err := json.Marshal(w)
	if err != nil {
		return OpAnswer{}, errs.Wrap(errs.Internal, "encode the op", err)
	}
	req, err := http.NewRequest(http.MethodPost, "http://bastion"+OpsPath, bytes.NewReader(body))
	if err != nil {
		return OpAnswer{}, errs.Wrap(errs.Internal, "encode the op", err)
	}
	req.Header.Set("Content-Type", "application/json")
	ex, err := s.exchange(ctx, d, bastionID, req)
	if err != nil {
		return OpAnswer{}, err
	}
	defer ex.close()
	raw, err := ex.body(MaxOpAnswer)
	if err != nil {
		return OpAnswer{}, errNoAnswer
	}
	return answerOp(w.Kind, w.OpID, ex.resp.StatusCode, raw)
}

// answerOp maps a bastion's answer to an op (its HTTP status and body).
// It is pure.
func answerOp(kind, opID string, status int, body []byte) (OpAnswer, error) {
	a, err := readAnswer(status, body)
	if err != nil {
		return OpAnswer{}, err
	}
	if a.OK {
		if a.Kind != kind || len(a.Result) == 0 {
			return OpAnswer{}, errNoAnswer
		}
		return OpAnswer{Status: OpDone, Kind: kind, OpID: opID, Result: a.Result}, nil
	}
	exp := a.expires
	return OpAnswer{Status: OpApprovalRequired, Kind: kind, OpID: opID, ApprovalRequest: a.ApprovalRequest, ApprovalExpires: &exp, Summary: a.Summary}, nil
}

// wireAnswer is a bastion's answer body.
type wireAnswer struct {
	OK              bool            `json:"ok"`
	Kind            string          `json:"kind"`
	Result          json.RawMessage `json:"result"`
	Code            string          `json:"code"`
	Reason          string          `json:"reason"`
	Message         string          `json:"message"`
	ApprovalRequest string          `json:"approval_request"`
	ApprovalExpires string          `json:"approval_expires"`
	Summary         string          `json:"summary"`
	expires         time.Time
}

// errNoAnswer is anything a bastion answers that is not a well-formed
// success, approval request or refusal.
var errNoAnswer = errs.New(errs.Unavailable, "the bastion did not answer the op")

// refusalStatus are the refusal codes a bastion answers, with their HTTP
// status on the wire.
var refusalStatus = map[errs.Code]int{errs.InvalidInput: http.StatusBadRequest, errs.AccessDenied: http.StatusForbidden, errs.NotFound: http.StatusNotFound}

// readAnswer decodes a bastion's answer: a success (200, ok) or an
// approval request (409 APPROVAL_REQUIRED with a well-formed request id,
// expiry and summary) with a nil error; a refusal as its coded error
// naming the bastion's reason ("unknown" when it is not kebab-case);
// anything else errNoAnswer. The bastion's message is never passed on.
func readAnswer(status int, body []byte) (wireAnswer, error) {
	var a wireAnswer
	if json.Unmarshal(body, &a) != nil {
		return a, errNoAnswer
	}
	if a.OK {
		if status != http.StatusOK {
			return a, errNoAnswer
		}
		return a, nil
	}
	if status == http.StatusConflict && a.Code == string(errs.ApprovalRequired) {
		exp, err := time.Parse(time.RFC3339, a.ApprovalExpires)
		if err != nil || !approvalRE.MatchString(a.ApprovalRequest) || len(a.Summary) > MaxSummary || !utf8.ValidString(a.Summary) {
			return a, errNoAnswer
		}
		a.expires = exp.UTC()
		return a, nil
	}
	code := errs.Code(a.Code)
	if want, ok := refusalStatus[code]; !ok || want != status {
		return a, errNoAnswer
	}
	reason := a.Reason
	if !wireReasonRE.MatchString(reason) {
		reason = "unknown"
	}
	return a, errs.New(code, "the bastion refused the op ("+reason+")")
}

// record writes one audit row of action on bastionID in tenant.
func (s *Service) record(ctx context.Context, actor audit.Entry, tenant, action, bastionID, outcome string, details map[string]any) error {
	return s.db.Tx(ctx, func(tx *sql.Tx) error {
		e := actor
		e.TenantID, e.Action, e.Resource, e.Outcome, e.Details = tenant, action, "bastion/"+bastionID, outcome, details
		return audit.Record(ctx, tx, s.clk.Now(), e)
	})
}

// recordAnswer writes the audit row of a bastion's answer: outcome
// "answered" (details status done, approval-required or opened),
// "refused" (with the code) or "failed"; a failure to write it is logged,
// the op having run.
func (s *Service) recordAnswer(ctx context.Context, actor audit.Entry, tenant, action, bastionID string, sent map[string]any, status string, err error) {
	d := map[string]any{"op_id": sent["op_id"], "session": sent["session"], "kind": sent["kind"], "status": status}
	outcome := "answered"
	if err != nil {
		code := errs.CodeOf(err)
		outcome, d["code"] = "refused", string(code)
		if code == errs.Unavailable || code == errs.Internal || code == errs.InvalidState {
			outcome = "failed"
		}
		d["message"] = errs.SafeMessage(err)
	}
	for k, v := range d {
		if v == nil || v == "" {
			delete(d, k)
		}
	}
	if aerr := s.record(context.WithoutCancel(ctx), actor, tenant, action, bastionID, outcome, d); aerr != nil {
		s.log.Error("bastion op answer not audited", "bastion", bastionID, "err", aerr)
	}
}

// randomB32 returns n random bytes in lowercase base32 (16 bytes: 26
// characters).
func randomB32(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("bastions: crypto/rand failed: " + err.Error())
	}
	return lowerB32.EncodeToString(b)
}
