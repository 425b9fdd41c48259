package server

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/gateway"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/quorum"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/secrets"
	"github.com/bettercompute/bettercompute/internal/signing"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/tunnels"
)

// registry adapts the nodes module to the gateway's Registry, so that the
// gateway depends on an interface and not on the store.
type registry struct{ n *nodes.Service }

func (r registry) CertInfo(ctx context.Context, serial string) (gateway.CertInfo, error) {
	st, err := r.n.CertState(ctx, serial)
	if errors.Is(err, nodes.ErrCertUnknown) {
		return gateway.CertInfo{}, errs.Wrap(errs.Unauthenticated, "certificate unknown", err)
	}
	if err != nil {
		return gateway.CertInfo{}, err
	}
	return gateway.CertInfo{NodeID: st.NodeID, Role: st.Role, Revoked: st.Revoked, RevokeReason: st.RevokeReason, AllowedKinds: st.AllowedKinds}, nil
}

func (r registry) OpenSession(ctx context.Context, h gateway.HelloInfo) (gateway.SessionResult, error) {
	out, err := r.n.OpenSession(ctx, nodes.Hello{NodeID: h.NodeID, BootID: h.BootID, Serial: h.Serial, SessionID: h.SessionID,
		GatewayID: h.GatewayID, Version: h.Version, Labels: h.Labels, Inventory: json.RawMessage(h.Inventory)})
	return gateway.SessionResult{Quarantined: out.Quarantined}, err
}

func (r registry) CloseSession(ctx context.Context, nodeID, sessionID string) error {
	return r.n.CloseSession(ctx, nodeID, sessionID)
}

func (r registry) CloseGatewaySessions(ctx context.Context, gatewayID string) error {
	return r.n.CloseGatewaySessions(ctx, gatewayID)
}

func (r registry) SupersededCertificateUsed(ctx context.Context, nodeID, serial string) (bool, error) {
	return r.n.SupersededCertificateUsed(ctx, nodeID, serial)
}

func (r registry) Heartbeat(ctx context.Context, gatewayID string) error {
	return r.n.Heartbeat(ctx, gatewayID)
}

func (r registry) SessionsMovedSince(ctx context.Context, gatewayID string, since time.Time) (map[string]string, time.Time, error) {
	return r.n.SessionsMovedSince(ctx, gatewayID, since)
}

func (r registry) RevokedSince(ctx context.Context, since time.Time) ([]string, time.Time, error) {
	return r.n.RevokedSince(ctx, since)
}

// gatewayServices adapts the nodes, secrets and quorum modules, and the
// workers' signed time statements and the sandboxes module, to the
// gateway's Services.
type gatewayServices struct {
	n   *nodes.Service
	sec *secrets.Service
	q   *quorum.Service
	db  *store.DB // the latest signed time statement is read from it
	sbx *sandboxes.Service
}

func (s gatewayServices) Secret(ctx context.Context, id pki.NodeIdentity, _ [][]byte, req *nodev1.SecretRequest) (string, error) {
	return s.sec.Release(ctx, id, req)
}

func (s gatewayServices) ApproverSets(ctx context.Context) ([]*nodev1.SignedApproverSet, error) {
	return s.q.Chain(ctx)
}

func (s gatewayServices) TimeStatement(ctx context.Context) (*nodev1.SignedTimeStatement, error) {
	return signing.LatestTimeStatement(ctx, s.db)
}

func (s gatewayServices) Bundle(context.Context) (*nodev1.SignedTrustBundle, error) {
	body, sig, pub, others := s.n.TrustBundle()
	if len(sig) == 0 {
		return nil, errs.New(errs.Internal, "this process holds no signed trust bundle")
	}
	sb := &nodev1.SignedTrustBundle{Body: body, Signature: sig, JoinPublicKey: pub}
	for _, o := range others {
		sb.OtherSignatures = append(sb.OtherSignatures, &nodev1.JoinKeySignature{JoinPublicKey: o.Key, Signature: o.Sig})
	}
	return sb, nil
}

func (s gatewayServices) Join(ctx context.Context, token string, csr []byte, name string) (string, [][]byte, error) {
	return s.n.Join(ctx, token, csr, name)
}

// Renew renews only when proof verifies against the leaf of chain, the
// certificate id was read from (verified by this process's TLS, or again by
// controlServer for a relayed call), so that both deployments refuse a
// renewal the node did not sign alike.
func (s gatewayServices) Renew(ctx context.Context, id pki.NodeIdentity, chain [][]byte, csr, proof []byte) ([][]byte, error) {
	var leaf *x509.Certificate
	if len(chain) > 0 {
		leaf, _ = x509.ParseCertificate(chain[0])
	}
	if err := s.n.CheckRenewProof(ctx, id, leaf, csr, proof); err != nil {
		return nil, err
	}
	return s.n.Renew(ctx, id, csr)
}

func (s gatewayServices) Refused(ctx context.Context, typ, reason, nodeID string) {
	s.n.RecordRefusal(ctx, typ, reason, nodeID)
}

// SandboxReport hands a node's signed sandbox report to the sandboxes
// module, which checks it and alone decides what it changes.
func (s gatewayServices) SandboxReport(ctx context.Context, nodeID, serial string, r *nodev1.SandboxReport) (string, error) {
	if s.sbx == nil {
		return "", errs.New(errs.InvalidConfig, "this process has no sandboxes module")
	}
	return s.sbx.ApplyReport(ctx, nodeID, serial, r)
}

// HelperEvents records a node's root-helper events as audit rows.
func (s gatewayServices) HelperEvents(ctx context.Context, nodeID string, m *nodev1.HelperEvents) error {
	return s.n.RecordHelperEvents(ctx, nodeID, m)
}

// tunnelOpener opens the tunnels module's tunnels through this process's
// gateway.
type tunnelOpener struct{ g *gateway.Gateway }

func (o tunnelOpener) OpenTunnel(ctx context.Context, to tunnels.Target, t *nodev1.SignedTicket) (tunnels.NodeStream, error) {
	s, err := o.g.OpenTunnel(ctx, gateway.TunnelTarget{NodeID: to.NodeID, Port: to.Port, SandboxID: to.SandboxID, Action: to.Action}, t)
	if err != nil {
		return nil, err
	}
	return nodeStream{s}, nil
}

// nodeStream is the gateway's node stream as the tunnels module reads it.
type nodeStream struct{ *gateway.NodeStream }

func (n nodeStream) Recv() (tunnels.Chunk, error) {
	data, eof, exit, err := n.NodeStream.Recv()
	return tunnels.Chunk{Data: data, EOF: eof, Exit: exit}, err
}
