package api

import (
	"context"
	"encoding/json"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/nodes"
)

// Modules are the domain services the API exposes.
type Modules struct {
	Nodes    *nodes.Service
	Commands *commands.Service
	Events   *audit.Events
}

// requireRoot refuses non-root callers for fleet-wide methods. The full
// role-based decision is the access-control issue's; until then only the
// root tenant manages the fleet.
func requireRoot(c *Caller) error {
	if !c.Root() {
		return errs.New(errs.AccessDenied, "access denied")
	}
	return nil
}

// Methods returns the methods of the security chain: nodes, join tokens,
// commands and security events.
func Methods(m Modules) []Method {
	type nodeIn struct {
		ID string `json:"id"`
	}
	type revokeIn struct {
		NodeID string `json:"node_id"`
		Serial string `json:"serial"`
	}
	type restrictIn struct {
		Serial       string   `json:"serial"`
		AllowedKinds []string `json:"allowed_kinds"`
	}
	type tokenIn struct {
		Role       string `json:"role"`
		Name       string `json:"name"`
		TTLSeconds int64  `json:"ttl_seconds"`
	}
	type createIn struct {
		NodeID     string          `json:"node_id"`
		Kind       string          `json:"kind"`
		Payload    json.RawMessage `json:"payload"`
		TTLSeconds int64           `json:"ttl_seconds"`
	}
	type getIn struct {
		ID string `json:"id"`
	}
	type eventsIn struct {
		Type string `json:"type"`
	}
	return []Method{
		{Name: "nodes.list", Action: "compute:nodes:list", Handle: Handler(func(ctx context.Context, c *Caller, _ struct{}) (any, error) {
			ns, err := m.Nodes.List(ctx, c.TenantID)
			if err != nil {
				return nil, err
			}
			return map[string]any{"nodes": ns}, nil
		})},
		{Name: "nodes.get", Action: "compute:nodes:get", Handle: Handler(func(ctx context.Context, c *Caller, in nodeIn) (any, error) {
			return m.Nodes.Get(ctx, c.TenantID, in.ID)
		})},
		{Name: "nodes.revoke", Action: "compute:nodes:revoke", Mutates: true, Handle: Handler(func(ctx context.Context, c *Caller, in revokeIn) (any, error) {
			if err := requireRoot(c); err != nil {
				return nil, err
			}
			if in.NodeID == "" {
				return nil, errs.New(errs.InvalidInput, "node_id is required")
			}
			if _, err := m.Nodes.TenantOf(ctx, in.NodeID); err != nil {
				return nil, err
			}
			n, err := m.Nodes.Revoke(ctx, c.Actor(), in.NodeID, in.Serial, nodes.ReasonOperator)
			if err != nil {
				return nil, err
			}
			return map[string]any{"revoked": n}, nil
		})},
		{Name: "nodes.restrict", Action: "compute:nodes:restrict", Mutates: true, Handle: Handler(func(ctx context.Context, c *Caller, in restrictIn) (any, error) {
			if err := requireRoot(c); err != nil {
				return nil, err
			}
			if in.Serial == "" {
				return nil, errs.New(errs.InvalidInput, "serial is required")
			}
			return map[string]any{}, m.Nodes.SetAllowedKinds(ctx, c.Actor(), in.Serial, in.AllowedKinds)
		})},
		{Name: "joinTokens.create", Action: "compute:join-tokens:create", Mutates: true, Handle: Handler(func(ctx context.Context, c *Caller, in tokenIn) (any, error) {
			if err := requireRoot(c); err != nil {
				return nil, err
			}
			return m.Nodes.CreateJoinToken(ctx, c.Actor(), in.Role, in.Name, time.Duration(in.TTLSeconds)*time.Second)
		})},
		{Name: "commands.create", Action: "compute:commands:create", Mutates: true, Handle: Handler(func(ctx context.Context, c *Caller, in createIn) (any, error) {
			if in.NodeID == "" || in.Kind == "" {
				return nil, errs.New(errs.InvalidInput, "node_id and kind are required")
			}
			return m.Commands.Create(ctx, c.Actor(), in.NodeID, in.Kind, in.Payload, time.Duration(in.TTLSeconds)*time.Second)
		})},
		{Name: "commands.get", Action: "compute:commands:get", Handle: Handler(func(ctx context.Context, c *Caller, in getIn) (any, error) {
			return m.Commands.Get(ctx, c.TenantID, in.ID)
		})},
		{Name: "events.list", Action: "compute:events:list", Handle: Handler(func(ctx context.Context, c *Caller, in eventsIn) (any, error) {
			if err := requireRoot(c); err != nil {
				return nil, err
			}
			evs, err := m.Events.List(ctx, in.Type)
			if err != nil {
				return nil, err
			}
			if evs == nil {
				evs = []audit.Event{}
			}
			return map[string]any{"events": evs}, nil
		})},
	}
}
