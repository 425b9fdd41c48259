package api

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/nodes"
)

// fanout is commands.fanout: one command of a kind for each node named by
// id or picked by labels, in one transaction; the answer names the
// fan-out id that groups them.
func fanout(m Modules) func(ctx context.Context, c *Caller, in apitypes.FanoutIn) (any, error) {
	return func(ctx context.Context, c *Caller, in apitypes.FanoutIn) (any, error) {
		sel := commands.Selector{NodeIDs: in.NodeIDs, Labels: in.Labels}
		if err := sel.Check(); err != nil {
			return nil, err
		}
		var fleet []nodes.Node
		if sel.ByLabels() {
			var err error
			if fleet, err = m.Nodes.Labeled(ctx, c.Scope()); err != nil {
				return nil, err
			}
		}
		ids, err := sel.Select(fleet)
		if err != nil {
			return nil, err
		}
		cmds, err := m.Commands.CreateMany(ctx, c.Actor(), ids, in.Kind, in.Payload, time.Duration(in.TTLSeconds)*time.Second)
		if err != nil {
			return nil, err
		}
		out := apitypes.FanoutOut{CommandIDs: make([]string, len(cmds)), Count: len(cmds)}
		for i, cm := range cmds {
			out.CommandIDs[i] = cm.ID
		}
		if len(cmds) > 0 {
			out.FanoutID = cmds[0].FanoutID
		}
		return out, nil
	}
}

// fanoutSummary is commands.fanoutSummary: a fan-out's commands the caller
// sees, counted by state (NOT_FOUND when it sees none).
func fanoutSummary(m Modules) func(ctx context.Context, c *Caller, in apitypes.FanoutSummaryIn) (any, error) {
	return func(ctx context.Context, c *Caller, in apitypes.FanoutSummaryIn) (any, error) {
		counts, err := m.Commands.FanoutSummary(ctx, c.Scope(), in.FanoutID)
		if err != nil {
			return nil, err
		}
		out := apitypes.FanoutSummary{FanoutID: in.FanoutID, States: map[string]int{}}
		for st, n := range counts {
			out.States[string(st)] = n
			out.Total += n
		}
		return out, nil
	}
}

// listCommands is commands.list: the commands the caller sees, filtered by
// node, state (INVALID_INPUT for none of the six) and fan-out.
func listCommands(m Modules) func(ctx context.Context, c *Caller, in apitypes.CommandListIn) (any, error) {
	return func(ctx context.Context, c *Caller, in apitypes.CommandListIn) (any, error) {
		cs, err := m.Commands.List(ctx, c.Scope(), commands.Filter{NodeID: in.NodeID, State: in.State, FanoutID: in.FanoutID, Limit: in.Limit})
		if err != nil {
			return nil, err
		}
		return map[string]any{"commands": cs}, nil
	}
}
