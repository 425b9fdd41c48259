package client

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
)

// FanoutIn is commands.fanout's input: node ids or labels, never both.
type FanoutIn = apitypes.FanoutIn

// FanoutOut is a fan-out's answer: its commands and the fan-out id that
// groups them.
type FanoutOut = apitypes.FanoutOut

// CommandListIn filters commands.list (node, state, fan-out, limit).
type CommandListIn = apitypes.CommandListIn

// FanoutSummary counts a fan-out's commands by state.
type FanoutSummary = apitypes.FanoutSummary

// Fanout queues one command of in.Kind for many nodes in one call.
func (c *Client) Fanout(ctx context.Context, in FanoutIn) (FanoutOut, error) {
	var out FanoutOut
	err := c.Call(ctx, "commands.fanout", in, &out)
	return out, err
}

// Commands lists the commands that match in, newest first (a state that
// is none of the six is INVALID_INPUT).
func (c *Client) Commands(ctx context.Context, in CommandListIn) ([]Command, error) {
	var out struct {
		Commands []Command `json:"commands"`
	}
	err := c.Call(ctx, "commands.list", in, &out)
	return out.Commands, err
}

// FanoutSummary counts fan-out id's commands by state.
func (c *Client) FanoutSummary(ctx context.Context, id string) (FanoutSummary, error) {
	var out FanoutSummary
	err := c.Call(ctx, "commands.fanoutSummary", apitypes.FanoutSummaryIn{FanoutID: id}, &out)
	return out, err
}

// WaitFanout polls fan-out id's summary every interval until all its
// commands are final or ctx ends, calling progress (when not nil) on
// every change of the counts. It returns the last summary read.
func (c *Client) WaitFanout(ctx context.Context, id string, interval time.Duration, progress func(FanoutSummary)) (FanoutSummary, error) {
	var last FanoutSummary
	for first := true; ; first = false {
		s, err := c.FanoutSummary(ctx, id)
		if err != nil {
			return last, err
		}
		if progress != nil && (first || !sameCounts(s, last)) {
			progress(s)
		}
		last = s
		if s.Done() {
			return s, nil
		}
		if err := sleepCtx(ctx, interval); err != nil {
			return s, err
		}
	}
}

// sameCounts reports whether a and b count the same states alike.
func sameCounts(a, b FanoutSummary) bool {
	if a.Total != b.Total || len(a.States) != len(b.States) {
		return false
	}
	for k, v := range a.States {
		if b.States[k] != v {
			return false
		}
	}
	return true
}
