package api

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/breakglass"
)

// breakGlassMethods are the break-glass SSH module's methods, each decided
// on the node (a node of another tenant answers as a missing one):
// nodes.issueSshCert as compute:nodes:ssh-root, never past the caller's
// credential; nodes.revokeSshCert as compute:nodes:ssh-revoke (its own
// action, so a role may end access without granting it); nodes.sshKrl as
// compute:nodes:get.
func breakGlassMethods(m Modules) []Method {
	if m.BreakGlass == nil {
		return nil
	}
	bg := m.BreakGlass
	return []Method{
		Def("nodes.issueSshCert", breakglass.ActionIssue, true, func(in breakglass.IssueIn) Target { return Target{Kind: "node", ID: in.NodeID} },
			func(ctx context.Context, c *Caller, in breakglass.IssueIn) (any, error) {
				return bg.Issue(ctx, c.Actor(), c.ExpiresAt, in)
			}).LimitedPerIdentity(bg.Limiter(), breakglass.LimitMessage),
		Def("nodes.revokeSshCert", breakglass.ActionRevoke, true, func(in breakglass.RevokeIn) Target { return Target{Kind: "node", ID: in.NodeID} },
			func(ctx context.Context, c *Caller, in breakglass.RevokeIn) (any, error) {
				return bg.Revoke(ctx, c.Actor(), in)
			}),
		Def("nodes.sshKrl", "compute:nodes:get", false, func(in breakglass.KRLIn) Target { return Target{Kind: "node", ID: in.NodeID} },
			func(ctx context.Context, c *Caller, in breakglass.KRLIn) (any, error) {
				return bg.KRL(ctx, c.Scope(), in.NodeID)
			}),
	}
}
