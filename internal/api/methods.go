package api

import (
	"context"
	"encoding/json"
	"time"

	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/secrets"
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

type tenantIn struct {
	TenantID string `json:"tenant_id" api:"max=64"`
}

func byTenant[In interface{ tenant() string }](in In) Target { return Target{Tenant: in.tenant()} }

func (t tenantIn) tenant() string { return t.TenantID }

// Methods returns every method of the security chain and access control.
func Methods(m Modules) []Method {
	type idIn struct {
		ID string `json:"id" api:"max=64"`
	}
	type revokeIn struct {
		NodeID string `json:"node_id" api:"max=64"`
		Serial string `json:"serial" api:"max=128"`
	}
	type restrictIn struct {
		NodeID       string   `json:"node_id" api:"max=64"`
		Serial       string   `json:"serial" api:"max=128"`
		AllowedKinds []string `json:"allowed_kinds" api:"items=64,max=64"`
	}
	type tokenIn struct {
		tenantIn
		Role       string `json:"role" api:"max=32"`
		Name       string `json:"name" api:"max=63"`
		TTLSeconds int64  `json:"ttl_seconds" api:"min=0,max=604800"`
	}
	type createIn struct {
		NodeID     string          `json:"node_id" api:"max=64"`
		Kind       string          `json:"kind" api:"max=64"`
		Payload    json.RawMessage `json:"payload"`
		TTLSeconds int64           `json:"ttl_seconds" api:"min=0,max=86400"`
	}
	type tokensIn struct {
		tenantIn
		Role       string `json:"role" api:"max=32"`
		Count      int    `json:"count" api:"min=1,max=10000"`
		TTLSeconds int64  `json:"ttl_seconds" api:"min=0,max=604800"`
	}
	type fanoutIn struct {
		tenantIn
		NodeIDs    []string          `json:"node_ids" api:"items=10000,max=64"`
		Labels     map[string]string `json:"labels" api:"items=64,keymax=63,max=63"`
		Kind       string            `json:"kind" api:"max=64"`
		Payload    json.RawMessage   `json:"payload"`
		TTLSeconds int64             `json:"ttl_seconds" api:"min=0,max=86400"`
	}
	type listIn struct {
		tenantIn
		NodeID string `json:"node_id" api:"max=64"`
		State  string `json:"state" api:"max=32"`
		Limit  int    `json:"limit" api:"min=0,max=1000"`
	}
	type eventsIn struct {
		Type string `json:"type" api:"max=128"`
	}
	byID := func(kind string) func(idIn) Target {
		return func(in idIn) Target { return Target{Kind: kind, ID: in.ID} }
	}
	return append([]Method{
		Def("nodes.list", "compute:nodes:list", false, byTenant[tenantIn], func(ctx context.Context, c *Caller, _ tenantIn) (any, error) {
			ns, err := m.Nodes.List(ctx, iam.ScopeOf(c.ActingTenant))
			if err != nil {
				return nil, err
			}
			return map[string]any{"nodes": ns}, nil
		}),
		Def("nodes.get", "compute:nodes:get", false, byID("node"), func(ctx context.Context, c *Caller, in idIn) (any, error) {
			return m.Nodes.Get(ctx, iam.ScopeOf(c.ActingTenant), in.ID)
		}),
		Def("nodes.revoke", "compute:nodes:revoke", true, func(in revokeIn) Target { return Target{Kind: "node", ID: in.NodeID} },
			func(ctx context.Context, c *Caller, in revokeIn) (any, error) {
				n, err := m.Nodes.Revoke(ctx, c.Actor(), in.NodeID, in.Serial, nodes.ReasonOperator)
				if err != nil {
					return nil, err
				}
				return map[string]any{"revoked": n}, nil
			}),
		Def("nodes.restrict", "compute:nodes:restrict", true, func(in restrictIn) Target { return Target{Kind: "node", ID: in.NodeID} },
			func(ctx context.Context, c *Caller, in restrictIn) (any, error) {
				return map[string]any{}, m.Nodes.RestrictCert(ctx, c.Actor(), in.NodeID, in.Serial, in.AllowedKinds)
			}),
		// A tenant other than root mints only node-tenant tokens: the
		// machines it joins are its own, so never platform nodes.
		Def("joinTokens.create", "compute:join-tokens:create", true, byTenant[tokenIn], func(ctx context.Context, c *Caller, in tokenIn) (any, error) {
			role, err := nodes.TokenRole(c.Root(), in.Role)
			if err != nil {
				return nil, err
			}
			return m.Nodes.CreateJoinToken(ctx, c.Actor(), role, in.Name, time.Duration(in.TTLSeconds)*time.Second)
		}),
		Def("joinTokens.createMany", "compute:join-tokens:create", true, byTenant[tokensIn], func(ctx context.Context, c *Caller, in tokensIn) (any, error) {
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
		Def("commands.fanout", "compute:commands:create", true, byTenant[fanoutIn], func(ctx context.Context, c *Caller, in fanoutIn) (any, error) {
			if (len(in.NodeIDs) == 0) == (len(in.Labels) == 0) {
				return nil, errs.New(errs.InvalidInput, "give node_ids or labels (one of them)")
			}
			ids := in.NodeIDs
			if len(in.Labels) > 0 {
				ns, err := m.Nodes.List(ctx, iam.ScopeOf(c.ActingTenant))
				if err != nil {
					return nil, err
				}
				for _, n := range ns {
					match := true
					for k, v := range in.Labels {
						if n.Labels[k] != v {
							match = false
							break
						}
					}
					if match {
						ids = append(ids, n.ID)
					}
				}
				if len(ids) == 0 {
					return nil, errs.New(errs.InvalidInput, "labels: no node matches")
				}
			}
			cmds, err := m.Commands.CreateMany(ctx, c.Actor(), ids, in.Kind, in.Payload, time.Duration(in.TTLSeconds)*time.Second)
			if err != nil {
				return nil, err
			}
			out := make([]string, len(cmds))
			for i, cm := range cmds {
				out[i] = cm.ID
			}
			return map[string]any{"count": len(out), "command_ids": out}, nil
		}),
		Def("commands.create", "compute:commands:create", true, func(in createIn) Target { return Target{Kind: "node", ID: in.NodeID} },
			func(ctx context.Context, c *Caller, in createIn) (any, error) {
				if in.Kind == "" {
					return nil, errs.New(errs.InvalidInput, "kind is required")
				}
				return m.Commands.Create(ctx, c.Actor(), in.NodeID, in.Kind, in.Payload, time.Duration(in.TTLSeconds)*time.Second)
			}),
		Def("commands.get", "compute:commands:get", false, byID("command"), func(ctx context.Context, c *Caller, in idIn) (any, error) {
			return m.Commands.Get(ctx, iam.ScopeOf(c.ActingTenant), in.ID)
		}),
		// The attestation is public evidence (signed bytes, signature and
		// certificate), read with the same permission as the command.
		Def("commands.attestation", "compute:commands:get", false, byID("command"), func(ctx context.Context, c *Caller, in idIn) (any, error) {
			return m.Commands.Attestation(ctx, iam.ScopeOf(c.ActingTenant), in.ID)
		}),
		Def("commands.list", "compute:commands:list", false, byTenant[listIn], func(ctx context.Context, c *Caller, in listIn) (any, error) {
			cs, err := m.Commands.List(ctx, iam.ScopeOf(c.ActingTenant), commands.Filter{NodeID: in.NodeID, State: in.State, Limit: in.Limit})
			if err != nil {
				return nil, err
			}
			return map[string]any{"commands": cs}, nil
		}),
		Def("events.list", "compute:events:list", false, func(eventsIn) Target { return Target{Tenant: iam.RootTenant} },
			func(ctx context.Context, c *Caller, in eventsIn) (any, error) {
				evs, err := m.Events.List(ctx, in.Type)
				if err != nil {
					return nil, err
				}
				if evs == nil {
					evs = []audit.Event{}
				}
				return map[string]any{"events": evs}, nil
			}),
	}, append(append(append(iamMethods(m), secretMethods(m)...), sandboxMethods(m)...), quotaMethods(m)...)...)
}

// sandboxResolver returns f of the sandbox module, or a resolver that
// finds nothing when the module is absent.
func (m Modules) sandboxResolver(f func(*sandboxes.Service) Resolver) Resolver {
	if m.Sandboxes == nil {
		return func(context.Context, string) (string, error) { return "", errs.New(errs.NotFound, "not found") }
	}
	return f(m.Sandboxes)
}
