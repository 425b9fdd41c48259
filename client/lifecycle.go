package client

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
)

// Whoami is who a credential speaks for.
type Whoami = apitypes.Whoami

// TenantDeleted is what deleting a tenant ended.
type TenantDeleted = apitypes.TenantDeleted

// JoinTokenInfo is a join token's metadata and state.
type JoinTokenInfo = apitypes.JoinTokenInfo

// Whoami answers who the client's credential speaks for.
func (c *Client) Whoami(ctx context.Context) (Whoami, error) {
	var out Whoami
	err := c.Call(ctx, "identities.whoami", struct{}{}, &out)
	return out, err
}

// DeleteTenant deletes a tenant and every tenant below it, tearing each
// down (sandboxes, warm pools, nodes' certificates, join tokens, keys and
// sessions).
func (c *Client) DeleteTenant(ctx context.Context, id string) (TenantDeleted, error) {
	var out TenantDeleted
	err := c.Call(ctx, "tenants.delete", apitypes.IDIn{ID: id}, &out)
	return out, err
}

// DeleteRole deletes a role of tenant ("" for the caller's own) and its
// bindings.
func (c *Client) DeleteRole(ctx context.Context, tenant, id string) error {
	return c.Call(ctx, "roles.delete", apitypes.TenantIDIn{TenantIn: tenantIn(tenant), ID: id}, nil)
}

// JoinTokens lists the join tokens of tenant ("" for the caller's own).
func (c *Client) JoinTokens(ctx context.Context, tenant string) ([]JoinTokenInfo, error) {
	var out struct {
		JoinTokens []JoinTokenInfo `json:"join_tokens"`
	}
	err := c.Call(ctx, "joinTokens.list", tenantIn(tenant), &out)
	return out.JoinTokens, err
}

// RevokeJoinToken revokes an unused join token of tenant.
func (c *Client) RevokeJoinToken(ctx context.Context, tenant, id string) error {
	return c.Call(ctx, "joinTokens.revoke", apitypes.TenantIDIn{TenantIn: tenantIn(tenant), ID: id}, nil)
}

// CancelCommand cancels a queued command.
func (c *Client) CancelCommand(ctx context.Context, id string) (Command, error) {
	var out Command
	err := c.Call(ctx, "commands.cancel", apitypes.IDIn{ID: id}, &out)
	return out, err
}

// Node returns one node.
func (c *Client) Node(ctx context.Context, id string) (Node, error) {
	var out Node
	err := c.Call(ctx, "nodes.get", apitypes.IDIn{ID: id}, &out)
	return out, err
}

// DeleteImage deletes an image of tenant by name.
func (c *Client) DeleteImage(ctx context.Context, tenant, name string) error {
	return c.Call(ctx, "images.delete", apitypes.ImageDeleteIn{TenantIn: tenantIn(tenant), Name: name}, nil)
}

// DeleteNode deletes a node for good (its certificates revoked).
func (c *Client) DeleteNode(ctx context.Context, id string) error {
	return c.Call(ctx, "nodes.delete", apitypes.IDIn{ID: id}, nil)
}
