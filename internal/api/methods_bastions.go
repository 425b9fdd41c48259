package api

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// The bastions module's actions. Reads are get and list, so the built-in
// viewer and operator roles (compute:*:get, compute:*:list) read bastions
// as they read nodes; admin holds every action.
const (
	ActionBastionsPair    = "compute:bastions:pair"
	ActionBastionsList    = "compute:bastions:list"
	ActionBastionsGet     = "compute:bastions:get"
	ActionBastionsGrant   = "compute:bastions:grant"
	ActionBastionsUnpair  = "compute:bastions:unpair"
	ActionBastionsConnect = "compute:bastions:connect"
	// ActionBastionsOp sends an op to a bastion (bastions.op).
	ActionBastionsOp = "compute:bastions:op"
	// ActionBastionsTerminal opens a terminal on a bastion (the terminal
	// endpoint).
	ActionBastionsTerminal = "compute:bastions:terminal"
)

// bastionResolver returns f of the bastions module, or a resolver that
// finds nothing when the module is absent.
func (m Modules) bastionResolver(f func(*bastions.Service) Resolver) Resolver {
	if m.Bastions == nil {
		return func(context.Context, string) (string, error) { return "", errs.New(errs.NotFound, "not found") }
	}
	return f(m.Bastions)
}

// bastionTarget is the target of an input naming one bastion.
func bastionTarget(id string) Target { return Target{Kind: "bastion", ID: id} }

// bastionMethods are the bastions module's methods. Another tenant's
// bastion, a missing one and a node that is not a bastion resolve alike
// (the envelope's one answer for each caller).
func bastionMethods(m Modules) []Method {
	if m.Bastions == nil {
		return nil
	}
	b := m.Bastions
	return []Method{
		Def("bastions.pairToken", ActionBastionsPair, true, byTenant[apitypes.BastionPairTokenIn], func(ctx context.Context, c *Caller, in apitypes.BastionPairTokenIn) (any, error) {
			tok, err := b.PairToken(ctx, c.Actor(), in.Name, time.Duration(in.TTLSeconds)*time.Second)
			if err != nil {
				return nil, err
			}
			return apitypes.BastionPairToken{Token: tok.Token, TokenID: tok.ID, ExpiresAt: tok.ExpiresAt}, nil
		}).ShownOnce(),
		Def("bastions.list", ActionBastionsList, false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			ls, err := b.List(ctx, c.Scope())
			if err != nil {
				return nil, err
			}
			return map[string]any{"bastions": ls}, nil
		}),
		Def("bastions.get", ActionBastionsGet, false, func(in apitypes.IDIn) Target { return bastionTarget(in.ID) }, func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
			return b.Get(ctx, c.Scope(), in.ID)
		}),
		Def("bastions.grant", ActionBastionsGrant, true, func(in apitypes.BastionGrantIn) Target { return bastionTarget(in.BastionID) },
			func(ctx context.Context, c *Caller, in apitypes.BastionGrantIn) (any, error) {
				return b.Grant(ctx, c.Actor(), c.Scope(), in.BastionID, bastions.GrantRequest{Allow: in.Allow, Deny: in.Deny, Models: in.Models,
					Reach: in.Reach, TTL: time.Duration(in.TTLSeconds) * time.Second})
			}),
		Def("bastions.grants", ActionBastionsGet, false, func(in apitypes.BastionIDIn) Target { return bastionTarget(in.BastionID) },
			func(ctx context.Context, c *Caller, in apitypes.BastionIDIn) (any, error) {
				gs, err := b.Grants(ctx, c.Scope(), in.BastionID)
				if err != nil {
					return nil, err
				}
				return map[string]any{"grants": gs}, nil
			}),
		Def("bastions.revokeGrant", ActionBastionsGrant, true, byID("bastion-grant"), func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
			return map[string]any{}, b.RevokeGrant(ctx, c.Actor(), c.ActingTenant, in.ID)
		}),
		// An op's answer can carry a person's file contents: it is never
		// kept for an idempotent replay (which answers CONFLICT).
		Def("bastions.op", ActionBastionsOp, true, func(in apitypes.BastionOpIn) Target { return bastionTarget(in.BastionID) },
			func(ctx context.Context, c *Caller, in apitypes.BastionOpIn) (any, error) {
				return b.Op(ctx, c.Actor(), c.Scope(), in.BastionID, in.Kind, in.Args, in.Approval)
			}).ShownOnce(),
		Def("bastions.unpair", ActionBastionsUnpair, true, func(in apitypes.IDIn) Target { return bastionTarget(in.ID) }, func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
			if err := b.Unpair(ctx, c.Actor(), c.Scope(), in.ID); err != nil {
				return nil, err
			}
			return map[string]any{"state": bastions.StateUnpaired}, nil
		}),
	}
}
