package client

import (
	"bytes"
	"context"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
)

// Image is a named, content-addressed sandbox image.
type Image = apitypes.Image

// ImportImage uploads tarball through the upload endpoint and names it
// in tenant ("" = the caller's own); the server checks the bytes hash to
// the digest the client computed.
func (c *Client) ImportImage(ctx context.Context, tenant, name string, tarball []byte) (Image, error) {
	return c.ImportImageFrom(ctx, tenant, name, bytes.NewReader(tarball), int64(len(tarball)), nil)
}

// Sandbox is a sandbox as the API shows it.
type Sandbox = apitypes.Sandbox

// ExecResult is the answer of sandboxes.exec: each stream capped, with
// truncation flagged, and the exit code of the sandbox's command.
type ExecResult = apitypes.ExecResult

// CreateSandbox makes a sandbox of template in tenant ("" = own) and
// returns once it runs.
func (c *Client) CreateSandbox(ctx context.Context, tenant, template string) (Sandbox, error) {
	var x Sandbox
	err := c.Call(ctx, "sandboxes.create", apitypes.SandboxCreateIn{TenantIn: tenantIn(tenant), Template: template}, &x)
	return x, err
}

// Sandbox returns one sandbox.
func (c *Client) Sandbox(ctx context.Context, id string) (Sandbox, error) {
	var x Sandbox
	err := c.Call(ctx, "sandboxes.get", apitypes.IDIn{ID: id}, &x)
	return x, err
}

// Exec runs argv (no shell) in a sandbox with a timeout in seconds (0:
// the server's default).
func (c *Client) Exec(ctx context.Context, id string, argv []string, timeoutSeconds int64) (ExecResult, error) {
	var r ExecResult
	err := c.Call(ctx, "sandboxes.exec", apitypes.ExecIn{ID: id, Argv: argv, TimeoutSeconds: timeoutSeconds}, &r)
	return r, err
}

// DeleteSandbox deletes a sandbox; freed reports whether its host
// confirmed removal within the server's bound.
func (c *Client) DeleteSandbox(ctx context.Context, id string) (bool, error) {
	var out struct {
		Freed bool `json:"freed"`
	}
	err := c.Call(ctx, "sandboxes.delete", apitypes.IDIn{ID: id}, &out)
	return out.Freed, err
}

// DeleteTemplate deletes a template by id and drains its warm pool; it
// returns how many warm sandboxes it drained and whether every host
// confirmed their removal in time.
func (c *Client) DeleteTemplate(ctx context.Context, id string) (drained int, freed bool, err error) {
	var out struct {
		Drained int  `json:"drained"`
		Freed   bool `json:"freed"`
	}
	err = c.Call(ctx, "templates.delete", apitypes.IDIn{ID: id}, &out)
	return out.Drained, out.Freed, err
}
