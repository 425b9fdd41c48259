package sandboxes

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"regexp"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// EventReportRefused is the security event of a sandbox report the module
// refused; its reason says why (report-malformed, report-other-node,
// cert-not-session, cert-unknown, cert-other-node, cert-revoked,
// cert-expired, bad-signature, sandbox-unknown, sandbox-other-node).
const EventReportRefused = "security.sandbox.report-refused"

// reasonRE bounds the reason a node gives: it is shown to the tenant.
var reasonRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// ReportAdopted is the state of a node's report that its host adopted
// the sandbox after a restart (phase two of adoption): the module
// confirms it or orders it killed (decideAdopted).
const ReportAdopted = "adopted"

// ApplyReport records a node's signed sandbox report received on nodeID's
// session, opened with certificate serial. The report must be signed
// (wire.SandboxReportSigContext) by the key of that certificate, which
// must be nodeID's, not revoked and not expired, and must name nodeID.
// A failed report must name a sandbox nodeID hosts: a running or warm
// sandbox becomes failed with the report's reason, audited in the
// sandbox's tenant. An adopted report is answered by applyAdopted. It
// returns the sandbox's id when handled (the node's ack); every refusal
// changes nothing and is recorded as an EventReportRefused.
func (s *Service) ApplyReport(ctx context.Context, nodeID, serial string, r *nodev1.SandboxReport) (string, error) {
	refuse := func(code errs.Code, reason string) (string, error) {
		s.nodes.RecordRefusal(ctx, EventReportRefused, reason, nodeID)
		s.log.Warn("sandbox report refused", "node_id", nodeID, "reason", reason)
		return "", errs.New(code, "sandbox report refused: "+reason)
	}
	var b nodev1.SandboxReportBody
	if err := proto.Unmarshal(r.GetBody(), &b); err != nil || (State(b.State) != StateFailed && b.State != ReportAdopted) ||
		!reasonRE.MatchString(b.Reason) || b.SandboxId == "" || (b.State == ReportAdopted && spec.ValidSandboxID(b.SandboxId) != nil) {
		return refuse(errs.InvalidInput, "report-malformed")
	}
	if b.NodeId != nodeID {
		return refuse(errs.AccessDenied, "report-other-node")
	}
	if r.GetCertSerial() != serial {
		return refuse(errs.AccessDenied, "cert-not-session")
	}
	if why, err := s.checkReportSig(ctx, nodeID, r); err != nil {
		return "", errs.Wrap(errs.Internal, "sandbox report not checked", err)
	} else if why != "" {
		return refuse(errs.AccessDenied, why)
	}
	var tenant, host, state string
	err := s.db.QueryRowContext(ctx, sqlReportRow, b.SandboxId).Scan(&tenant, &host, &state)
	found := err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", errs.Wrap(errs.Internal, "sandbox report not recorded", err)
	}
	if b.State == ReportAdopted {
		return s.applyAdopted(ctx, nodeID, b.SandboxId, found, host, State(state))
	}
	if !found {
		return refuse(errs.NotFound, "sandbox-unknown")
	}
	if host != nodeID {
		return refuse(errs.AccessDenied, "sandbox-other-node")
	}
	return s.applyFailed(ctx, nodeID, tenant, state, &b)
}

// applyFailed marks a running or warm sandbox of nodeID failed with the
// report's reason, audited in the sandbox's tenant.
func (s *Service) applyFailed(ctx context.Context, nodeID, tenant, state string, b *nodev1.SandboxReportBody) (string, error) {
	now := s.clk.Now()
	changed := false
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, sqlReportFail, StateFailed, b.Reason, now.UnixMilli(), b.SandboxId, nodeID, StateRunning, StateWarm)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil || n != 1 {
			return err // already final (or still starting): nothing to record
		}
		changed = true
		return audit.Record(ctx, tx, now, audit.Entry{TenantID: tenant, Actor: "node:" + nodeID, Action: "compute:sandboxes:failed",
			Resource: "sandbox/" + b.SandboxId, Outcome: "allowed", Details: map[string]any{"reason": b.Reason, "node_id": nodeID, "at_ms": b.AtMs}})
	})
	if err != nil {
		return "", errs.Wrap(errs.Internal, "sandbox report not recorded", err)
	}
	if changed && state == StateWarm {
		s.bus.Publish(TopicWarm) // the pool lost one
	}
	if changed {
		s.log.Info("sandbox failed on its host", "sandbox_id", b.SandboxId, "node_id", nodeID, "reason", b.Reason)
	}
	return b.SandboxId, nil
}

// applyAdopted answers a node that adopted sandbox id after a restart:
// confirmed (the ack alone) when the sandbox is recorded live on that
// node, else the node is sent a signed sandbox.delete for it (the only
// order a node kills on), audited in the root tenant with the reason.
// The ack goes only once the delete is queued.
func (s *Service) applyAdopted(ctx context.Context, nodeID, id string, found bool, host string, state State) (string, error) {
	confirm, why := decideAdopted(nodeID, found, host, state)
	if confirm {
		s.log.Info("adopted sandbox confirmed", "sandbox_id", id, "node_id", nodeID)
		return id, nil
	}
	if wait := s.adoptKills.Take(nodeID); wait > 0 {
		s.log.Warn("adopted reports over their rate", "sandbox_id", id, "node_id", nodeID)
		return "", errs.New(errs.ResourceExhausted, "too many adopted sandboxes to delete: report again later")
	}
	actor := audit.Entry{TenantID: iam.RootTenant, Actor: "adoption"}
	raw, _ := json.Marshal(spec.Delete{SandboxID: id})
	c, err := s.commands.CreateOwned(ctx, kinds.ModuleSandboxes, system(actor), nodeID, kinds.SandboxDelete, raw, 24*time.Hour)
	if err != nil {
		return "", errs.Wrap(errs.Internal, "adopted sandbox's delete not queued", err)
	}
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		return audit.Record(ctx, tx, s.clk.Now(), audit.Entry{TenantID: iam.RootTenant, Actor: "sandboxes:adoption", Action: "compute:sandboxes:adoption-kill",
			Resource: "sandbox/" + id, Outcome: "allowed", Details: map[string]any{"reason": why, "node_id": nodeID, "command_id": c.ID}})
	})
	if err != nil {
		return "", errs.Wrap(errs.Internal, "adoption kill not audited", err)
	}
	s.log.Warn("adopted sandbox ordered killed", "sandbox_id", id, "node_id", nodeID, "reason", why, "command_id", c.ID)
	return id, nil
}

// checkReportSig checks a report's signature against the certificate it
// names: nodeID's, not revoked, not expired. It returns why it fails, or
// "", and an error only when the certificate cannot be read.
func (s *Service) checkReportSig(ctx context.Context, nodeID string, r *nodev1.SandboxReport) (string, error) {
	st, err := s.nodes.CertState(ctx, r.GetCertSerial())
	switch {
	case errors.Is(err, nodes.ErrCertUnknown):
		return "cert-unknown", nil
	case err != nil:
		return "", err
	case st.NodeID != nodeID:
		return "cert-other-node", nil
	case st.Revoked:
		return "cert-revoked", nil
	case s.clk.Now().After(st.NotAfter):
		return "cert-expired", nil
	}
	if !wire.VerifyNode(st.Cert.PublicKey, wire.SandboxReportSigContext, r.GetBody(), r.GetNodeSig()) {
		return "bad-signature", nil
	}
	return "", nil
}
