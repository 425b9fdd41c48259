package api

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/breakglass"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/revocations"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previews"
	"github.com/bettercompute/bettercompute/internal/secrets"
	"github.com/bettercompute/bettercompute/internal/tunnels"
)

// Modules are the domain services the API exposes.
type Modules struct {
	Nodes    *nodes.Service
	Commands *commands.Service
	Events   *audit.Events
	IAM      *iam.Service
	Keys     *apikeys.Service
	Secrets  *secrets.Service
	// Sandboxes is optional (nil: no sandbox methods).
	Sandboxes *sandboxes.Service
	// Quotas is optional (nil: no quota methods).
	Quotas *quota.Service
	// Tunnels is optional (nil: no tunnel methods or endpoint).
	Tunnels *tunnels.Service
	// BreakGlass is optional (nil: no break-glass SSH methods).
	BreakGlass *breakglass.Service
	// Revocations is optional (nil: no revocations.list).
	Revocations *revocations.Feed
	// Bastions is optional (nil: no bastion methods).
	Bastions *bastions.Service
	// Previews is optional (nil: no sandboxes.preview or
	// previews.rotateKey).
	Previews *previews.Service
}

// Resolvers returns how each resource kind's tenant is found.
func (m Modules) Resolvers() map[string]Resolver {
	return map[string]Resolver{
		"node":    m.Nodes.TenantOf,
		"command": m.Commands.TenantOf,
		"api-key": m.Keys.TenantOf,
		"secret":  m.Secrets.TenantOf,
		// The sandbox module's kinds; a warm sandbox answers as missing.
		"sandbox":      m.sandboxResolver(func(s *sandboxes.Service) Resolver { return s.TenantOf }),
		"template":     m.sandboxResolver(func(s *sandboxes.Service) Resolver { return s.TemplateTenantOf }),
		"image-upload": m.sandboxResolver(func(s *sandboxes.Service) Resolver { return s.UploadTenantOf }),
		// The bastions module's kinds: a bastion is a node of role bastion.
		"bastion":       m.bastionResolver(func(b *bastions.Service) Resolver { return b.TenantOf }),
		"bastion-grant": m.bastionResolver(func(b *bastions.Service) Resolver { return b.GrantTenantOf }),
		"tenant": func(ctx context.Context, id string) (string, error) {
			chain, err := m.IAM.Chain(ctx, id)
			if err != nil {
				return "", err
			}
			switch len(chain) {
			case 0:
				return "", errs.New(errs.NotFound, "tenant not found")
			case 1:
				return chain[0].ID, nil // the root tenant owns itself
			}
			return chain[1].ID, nil // a tenant is managed from its parent
		},
	}
}

// byTenant is the target of an input that names a tenant.
func byTenant[In interface{ Tenant() string }](in In) Target { return Target{Tenant: in.Tenant()} }

// byID returns the target of an input naming one resource of kind.
func byID(kind string) func(apitypes.IDIn) Target {
	return func(in apitypes.IDIn) Target { return Target{Kind: kind, ID: in.ID} }
}

// Methods returns every method of the security chain and access control.
// Inputs and answers built here are apitypes' (shared with the client).
func Methods(m Modules) []Method {
	return heldBack(m, append([]Method{
		Def("nodes.list", "compute:nodes:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			ns, err := m.Nodes.List(ctx, c.Scope())
			if err != nil {
				return nil, err
			}
			return map[string]any{"nodes": ns}, nil
		}),
		Def("nodes.get", "compute:nodes:get", false, byID("node"), func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
			return m.Nodes.Get(ctx, c.Scope(), in.ID)
		}),
		Def("nodes.revoke", "compute:nodes:revoke", true, func(in apitypes.NodeRevokeIn) Target { return Target{Kind: "node", ID: in.NodeID} },
			func(ctx context.Context, c *Caller, in apitypes.NodeRevokeIn) (any, error) {
				n, err := m.Nodes.Revoke(ctx, c.Actor(), in.NodeID, in.Serial, nodes.ReasonOperator)
				if err != nil {
					return nil, err
				}
				return apitypes.RevokedOut{Revoked: n}, nil
			}),
		Def("nodes.restrict", "compute:nodes:restrict", true, func(in apitypes.NodeRestrictIn) Target { return Target{Kind: "node", ID: in.NodeID} },
			func(ctx context.Context, c *Caller, in apitypes.NodeRestrictIn) (any, error) {
				return map[string]any{}, m.Nodes.RestrictCert(ctx, c.Actor(), in.NodeID, in.Serial, in.AllowedKinds)
			}),
		// A tenant other than root mints only node-tenant tokens: the
		// machines it joins are its own, so never platform nodes.
		Def("joinTokens.create", "compute:join-tokens:create", true, byTenant[apitypes.JoinTokenIn], func(ctx context.Context, c *Caller, in apitypes.JoinTokenIn) (any, error) {
			role, err := nodes.TokenRole(c.Root(), in.Role)
			if err != nil {
				return nil, err
			}
			return m.Nodes.CreateJoinToken(ctx, c.Actor(), role, in.Name, time.Duration(in.TTLSeconds)*time.Second)
		}),
		Def("joinTokens.createMany", "compute:join-tokens:create", true, byTenant[apitypes.JoinTokensIn], func(ctx context.Context, c *Caller, in apitypes.JoinTokensIn) (any, error) {
			role, err := nodes.TokenRole(c.Root(), in.Role)
			if err != nil {
				return nil, err
			}
			ts, err := m.Nodes.CreateJoinTokens(ctx, c.Actor(), role, in.Count, time.Duration(in.TTLSeconds)*time.Second)
			if err != nil {
				return nil, err
			}
			return map[string]any{"tokens": ts}, nil
		}),
		Def("commands.fanout", "compute:commands:create", true, byTenant[apitypes.FanoutIn], fanout(m)),
		Def("commands.create", "compute:commands:create", true, func(in apitypes.CommandIn) Target { return Target{Kind: "node", ID: in.NodeID} },
			func(ctx context.Context, c *Caller, in apitypes.CommandIn) (any, error) {
				if in.Kind == "" {
					return nil, errs.New(errs.InvalidInput, "kind is required")
				}
				return m.Commands.Create(ctx, c.Actor(), in.NodeID, in.Kind, in.Payload, time.Duration(in.TTLSeconds)*time.Second)
			}),
		Def("commands.get", "compute:commands:get", false, byID("command"), func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
			return m.Commands.Get(ctx, c.Scope(), in.ID)
		}),
		// The attestation is public evidence (signed bytes, signature and
		// certificate), read with the same permission as the command.
		Def("commands.attestation", "compute:commands:get", false, byID("command"), func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
			return m.Commands.Attestation(ctx, c.Scope(), in.ID)
		}),
		Def("commands.list", "compute:commands:list", false, byTenant[apitypes.CommandListIn], listCommands(m)),
		Def("commands.fanoutSummary", "compute:commands:list", false, byTenant[apitypes.FanoutSummaryIn], fanoutSummary(m)),
		Def("events.list", "compute:events:list", false, func(apitypes.EventListIn) Target { return Target{Tenant: iam.RootTenant} },
			func(ctx context.Context, c *Caller, in apitypes.EventListIn) (any, error) {
				evs, err := m.Events.List(ctx, in.Type)
				if err != nil {
					return nil, err
				}
				if evs == nil {
					evs = []audit.Event{}
				}
				return map[string]any{"events": evs}, nil
			}),
	}, append(append(append(iamMethods(m), secretMethods(m)...), sandboxMethods(m)...), append(append(append(quotaMethods(m), lifecycleMethods(m)...), tunnelMethods(m)...), append(append(append(breakGlassMethods(m), revocationMethods(m)...), bastionMethods(m)...), append(previewMethods(m), approvalMethods(m)...)...)...)...)...))
}

// sandboxResolver returns f of the sandbox module, or a resolver that
// finds nothing when the module is absent.
func (m Modules) sandboxResolver(f func(*sandboxes.Service) Resolver) Resolver {
	if m.Sandboxes == nil {
		return func(context.Context, string) (string, error) { return "", errs.New(errs.NotFound, "not found") }
	}
	return f(m.Sandboxes)
}
