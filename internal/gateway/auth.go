package gateway

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// PublicMethods are the only methods the gateway serves without a client
// certificate: a node that has not joined yet has none. Every other
// method, including one added later, is authenticated by the interceptors
// before its handler runs.
var PublicMethods = map[string]bool{
	nodev1.Gateway_Bundle_FullMethodName: true,
	nodev1.Gateway_Join_FullMethodName:   true,
}

// refusal is how a method answers a caller whose certificate failed: the
// event type the refusal is recorded as and the error the node gets.
type refusal struct {
	event string
	err   error
}

var (
	errUnauthenticated = status.Error(codes.Unauthenticated, string(errs.Unauthenticated))
	errAccessDenied    = status.Error(codes.PermissionDenied, string(errs.AccessDenied))
	// errCertRevoked refuses a session of a revoked certificate's holder
	// (see wire.RevokedMessage); bcd stops reconnecting on it.
	errCertRevoked = status.Error(codes.Unauthenticated, wire.RevokedMessage)
)

// refusals maps each authenticated method to its refusal; a method missing
// here is refused UNAUTHENTICATED as security.call.refused.
var refusals = map[string]refusal{
	nodev1.Gateway_Renew_FullMethodName:   {event: "security.renew.refused", err: errAccessDenied},
	nodev1.Gateway_Secret_FullMethodName:  {event: "security.secret.refused", err: errAccessDenied},
	nodev1.Gateway_Session_FullMethodName: {event: "security.session.refused", err: errUnauthenticated},
	nodev1.Gateway_Tunnel_FullMethodName:  {event: "security.tunnel.refused", err: errAccessDenied},
	nodev1.Gateway_Bastion_FullMethodName: {event: "security.bastion.refused", err: errUnauthenticated},
}

// bastionMethods are the only methods a bastion-role certificate may call;
// the Bastion stream is the only one a bastion may call and no other role.
var bastionMethods = map[string]bool{
	nodev1.Gateway_Renew_FullMethodName:   true,
	nodev1.Gateway_Bastion_FullMethodName: true,
}

// roleAllows reports whether a certificate of role may call method.
func roleAllows(role, method string) bool {
	if role == pki.RoleBastion || method == nodev1.Gateway_Bastion_FullMethodName {
		return role == pki.RoleBastion && bastionMethods[method]
	}
	return true
}

var defaultRefusal = refusal{event: "security.call.refused", err: errUnauthenticated}

// caller is what authentication proved about a node, carried on the
// context of an authenticated call.
type caller struct {
	id pki.NodeIdentity
	ci CertInfo
}

type callerKey struct{}

// callerFrom returns the authenticated caller on ctx; ok is false when the
// call did not pass the interceptors (a handler then refuses it).
func callerFrom(ctx context.Context) (caller, bool) {
	c, ok := ctx.Value(callerKey{}).(caller)
	return c, ok
}

// admit authenticates a call to method unless method is public, and
// returns the context the handler runs with.
func (g *Gateway) admit(ctx context.Context, method string) (context.Context, error) {
	if PublicMethods[method] {
		return ctx, nil
	}
	id, ci, reason, err := g.authenticate(ctx)
	if err != nil {
		r := refusalFor(method)
		g.cfg.Log.Info("call refused", "method", method, "node_id", id.NodeID, "reason", reason)
		g.svc.Refused(ctx, r.event, reason, id.NodeID)
		if (method == nodev1.Gateway_Session_FullMethodName || method == nodev1.Gateway_Bastion_FullMethodName) && reason == reasonRevoked {
			return nil, errCertRevoked
		}
		return nil, r.err
	}
	if !roleAllows(ci.Role, method) {
		r := refusalFor(method)
		g.cfg.Log.Info("call refused", "method", method, "node_id", id.NodeID, "reason", "role-not-allowed")
		g.svc.Refused(ctx, r.event, "role-not-allowed", id.NodeID)
		return nil, errAccessDenied
	}
	return context.WithValue(ctx, callerKey{}, caller{id: id, ci: ci}), nil
}

// unaryAuth is the unary interceptor: see admit.
func (g *Gateway) unaryAuth(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := g.admit(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// streamAuth is the stream interceptor: see admit.
func (g *Gateway) streamAuth(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := g.admit(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return handler(srv, &authedStream{ServerStream: ss, ctx: ctx})
}

// authedStream is a server stream whose context carries the caller.
type authedStream struct {
	grpc.ServerStream
	ctx context.Context
}

// Context returns the stream's context with the authenticated caller.
func (s *authedStream) Context() context.Context { return s.ctx }

// mustCaller returns the caller the interceptors put on ctx. A handler
// reached without them (never, through GRPCServer) refuses the call.
func mustCaller(ctx context.Context, method string) (caller, error) {
	c, ok := callerFrom(ctx)
	if !ok {
		return caller{}, refusalFor(method).err
	}
	return c, nil
}

// refusalFor is how method refuses a caller: its own entry in refusals,
// else defaultRefusal (a method added without one).
func refusalFor(method string) refusal {
	if r, ok := refusals[method]; ok {
		return r
	}
	return defaultRefusal
}

// reasonSuperseded is the revocation reason of a certificate a renewal
// replaced (nodes.ReasonSuperseded; the gateway does not import nodes).
const reasonSuperseded = "superseded"

// reasonRevoked is authenticate's reason for a revoked certificate other
// than a superseded one.
const reasonRevoked = "certificate-revoked"

// authenticate checks the caller's client certificate: chain to the node
// CA, trust domain, role and expiry, then revocation and role in the
// registry. Any failure is UNAUTHENTICATED with a reason for the log and
// the event log.
func (g *Gateway) authenticate(ctx context.Context) (pki.NodeIdentity, CertInfo, string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return pki.NodeIdentity{}, CertInfo{}, "no-peer", errUnauthenticated
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return pki.NodeIdentity{}, CertInfo{}, "no-client-certificate", errUnauthenticated
	}
	id, err := pki.VerifyNodeChain(ti.State.PeerCertificates, g.cfg.NodeRoots, g.cfg.TrustDomain, g.cfg.Clock.Now())
	if err != nil {
		g.cfg.Log.Info("node certificate does not verify", "peer", p.Addr.String(), "err", err)
		return pki.NodeIdentity{}, CertInfo{}, "certificate-invalid", errUnauthenticated
	}
	ci, err := g.reg.CertInfo(ctx, id.Serial)
	switch {
	case err != nil:
		g.cfg.Log.Info("node certificate unknown", "node_id", id.NodeID, "err", err)
		return id, ci, "certificate-unknown", errUnauthenticated
	case ci.Revoked && ci.RevokeReason == reasonSuperseded && ci.NodeID == id.NodeID:
		// The node renewed and uses its new certificate: whoever still
		// holds the old one holds a copy of the identity.
		if q, err := g.reg.SupersededCertificateUsed(ctx, id.NodeID, id.Serial); err != nil {
			g.cfg.Log.Error("record superseded certificate", "node_id", id.NodeID, "err", err)
		} else if q {
			g.cfg.Log.Warn("node quarantined", "node_id", id.NodeID, "serial", id.Serial)
		}
		return id, ci, "certificate-superseded", errUnauthenticated
	case ci.Revoked:
		return id, ci, reasonRevoked, errUnauthenticated
	case ci.NodeID != id.NodeID || ci.Role != id.Role:
		return id, ci, "certificate-mismatch", errUnauthenticated
	}
	return id, ci, "", nil
}

// peerChain returns the DER of the client certificate chain on ctx.
func peerChain(ctx context.Context) [][]byte {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil
	}
	var out [][]byte
	for _, c := range ti.State.PeerCertificates {
		out = append(out, c.Raw)
	}
	return out
}
