package client

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
)

// BastionPairToken is a bastion's one-time pairing token; Token is shown
// once.
type BastionPairToken = apitypes.BastionPairToken

// BastionSummary is a bastion as bastions.list shows it.
type BastionSummary = apitypes.BastionSummary

// Bastion is one bastion as bastions.get shows it.
type Bastion = apitypes.Bastion

// BastionGrant is a grant as the API shows it.
type BastionGrant = apitypes.BastionGrant

// BastionGrantIn is what a grant says (bastions.grant's input).
type BastionGrantIn = apitypes.BastionGrantIn

// PairBastion makes a one-time pairing token for a bastion named name,
// valid for ttl (0: one hour).
func (c *Client) PairBastion(ctx context.Context, name string, ttl time.Duration) (BastionPairToken, error) {
	var out BastionPairToken
	err := c.Call(ctx, "bastions.pairToken", apitypes.BastionPairTokenIn{Name: name, TTLSeconds: int64(ttl / time.Second)}, &out)
	return out, err
}

// Bastions lists the bastions of the caller's tenant (every tenant's for
// root).
func (c *Client) Bastions(ctx context.Context) ([]BastionSummary, error) {
	var out struct {
		Bastions []BastionSummary `json:"bastions"`
	}
	err := c.Call(ctx, "bastions.list", nil, &out)
	return out.Bastions, err
}

// Bastion returns one bastion.
func (c *Client) Bastion(ctx context.Context, id string) (Bastion, error) {
	var out Bastion
	err := c.Call(ctx, "bastions.get", apitypes.IDIn{ID: id}, &out)
	return out, err
}

// GrantBastion signs and stores a grant for in.BastionID.
func (c *Client) GrantBastion(ctx context.Context, in BastionGrantIn) (BastionGrant, error) {
	var out BastionGrant
	err := c.Call(ctx, "bastions.grant", in, &out)
	return out, err
}

// BastionGrants lists a bastion's grants, newest first.
func (c *Client) BastionGrants(ctx context.Context, bastionID string) ([]BastionGrant, error) {
	var out struct {
		Grants []BastionGrant `json:"grants"`
	}
	err := c.Call(ctx, "bastions.grants", apitypes.BastionIDIn{BastionID: bastionID}, &out)
	return out.Grants, err
}

// RevokeBastionGrant revokes one grant.
func (c *Client) RevokeBastionGrant(ctx context.Context, grantID string) error {
	return c.Call(ctx, "bastions.revokeGrant", apitypes.IDIn{ID: grantID}, nil)
}

// UnpairBastion unpairs a bastion for good (its certificates are revoked).
func (c *Client) UnpairBastion(ctx context.Context, id string) error {
	return c.Call(ctx, "bastions.unpair", apitypes.IDIn{ID: id}, nil)
}

// BastionOpIn is an op for a bastion (bastions.op's input).
type BastionOpIn = apitypes.BastionOpIn

// BastionOpAnswer is bastions.op's answer: done with its result, or
// approval-required with the request the person approves on the machine.
type BastionOpAnswer = apitypes.BastionOpAnswer

// BastionOp sends an op to a bastion. An approval request is an answer
// (Status "approval-required"), not an error: the person runs `bcd
// bastion approve ID` on the machine, then the same op is sent again with
// Approval set to ID.
func (c *Client) BastionOp(ctx context.Context, in BastionOpIn) (BastionOpAnswer, error) {
	var out BastionOpAnswer
	err := c.Call(ctx, "bastions.op", in, &out)
	return out, err
}
