package mcpgate

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// TenantIn names the tenant a call acts in ("" for the caller's own).
type TenantIn struct {
	TenantID string `json:"tenant_id,omitempty" jsonschema:"the tenant (default: your own)"`
}

// NodeIn names one node.
type NodeIn struct {
	NodeID string `json:"node_id" jsonschema:"the node's id"`
}

// RunCommandIn is run_command's input.
type RunCommandIn struct {
	NodeID         string         `json:"node_id" jsonschema:"the node's id"`
	Kind           string         `json:"kind" jsonschema:"a non-destructive command kind, such as node.ping or diag.run"`
	Payload        map[string]any `json:"payload,omitempty" jsonschema:"the kind's JSON payload (an object)"`
	TimeoutSeconds int64          `json:"timeout_seconds,omitempty" jsonschema:"how long to wait for the result (default 60, at most 600)"`
}

// FanoutIn is fanout_command's input: node ids or labels, never both.
type FanoutIn struct {
	TenantID       string            `json:"tenant_id,omitempty" jsonschema:"the tenant (default: your own)"`
	NodeIDs        []string          `json:"node_ids,omitempty" jsonschema:"the nodes' ids"`
	Labels         map[string]string `json:"labels,omitempty" jsonschema:"pick the nodes carrying all these labels"`
	Kind           string            `json:"kind" jsonschema:"a non-destructive command kind"`
	Payload        map[string]any    `json:"payload,omitempty" jsonschema:"the kind's JSON payload (an object)"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty" jsonschema:"how long to wait for all results (default 60, at most 600)"`
}

// CreateSandboxIn is create_sandbox's input.
type CreateSandboxIn struct {
	TenantID       string `json:"tenant_id,omitempty" jsonschema:"the tenant (default: your own)"`
	Template       string `json:"template,omitempty" jsonschema:"the template's name or id"`
	FromCheckpoint string `json:"from_checkpoint,omitempty" jsonschema:"a checkpoint of yours to restore"`
}

// ExecIn is exec_sandbox's input.
type ExecIn struct {
	SandboxID      string   `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Argv           []string `json:"argv" jsonschema:"the program and its arguments (no shell)"`
	TimeoutSeconds int64    `json:"timeout_seconds,omitempty" jsonschema:"the command's timeout (0: the server's default, at most 600)"`
}

// SandboxIn names one sandbox.
type SandboxIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
}

// CheckpointIn is checkpoint_sandbox's input.
type CheckpointIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Memory    bool   `json:"memory,omitempty" jsonschema:"capture the processes' memory too (runsc only)"`
}

// AuditListIn is list_audit_events's input.
type AuditListIn struct {
	TenantID string `json:"tenant_id,omitempty" jsonschema:"the tenant (default: your own)"`
	Since    int64  `json:"since,omitempty" jsonschema:"sealed events from this sequence number on"`
	Limit    int    `json:"limit,omitempty" jsonschema:"at most this many events (0: the server's maximum)"`
}

// AuditProveIn is prove_audit_event's input.
type AuditProveIn struct {
	TenantID string `json:"tenant_id,omitempty" jsonschema:"the tenant (default: your own)"`
	EventID  string `json:"event_id" jsonschema:"the event's id"`
}

// maxWait bounds how long a tool waits for a command or fan-out.
const (
	defaultWait = 60
	maxWait     = 600
)

// checkPayload refuses a payload carrying SSH key material.
func checkPayload(p map[string]any) error {
	raw, err := json.Marshal(p)
	if err != nil {
		return errs.New(errs.InvalidInput, "payload: not JSON")
	}
	return checkNoSSHKey(string(raw))
}

// payload encodes a tool's payload for the API (none: no payload).
func payload(p map[string]any) json.RawMessage {
	if p == nil {
		return nil
	}
	raw, _ := json.Marshal(p) // checkPayload encoded it already
	return raw
}

func checkListNodes(in TenantIn) error { return checkTenant(in.TenantID) }

func checkShowNode(in NodeIn) error { return checkID("node_id", "node", prefixNode, in.NodeID) }

func checkWait(s int64) error {
	if s < 0 || s > maxWait {
		return errs.New(errs.InvalidInput, "timeout_seconds: 0 to 600")
	}
	return nil
}

// checkCommand checks what a command tool and a fan-out share: the kind,
// the wait and the payload, in that order.
func checkCommand(kind string, wait int64, payload map[string]any) error {
	if err := checkKind(kind); err != nil {
		return err
	}
	if err := checkWait(wait); err != nil {
		return err
	}
	return checkPayload(payload)
}

func checkRunCommand(in RunCommandIn) error {
	if err := checkID("node_id", "node", prefixNode, in.NodeID); err != nil {
		return err
	}
	return checkCommand(in.Kind, in.TimeoutSeconds, in.Payload)
}

func checkFanout(in FanoutIn) error {
	if err := checkTenant(in.TenantID); err != nil {
		return err
	}
	for _, id := range in.NodeIDs {
		if err := checkID("node_ids", "node", prefixNode, id); err != nil {
			return err
		}
	}
	return checkCommand(in.Kind, in.TimeoutSeconds, in.Payload)
}

func checkCreateSandbox(in CreateSandboxIn) error {
	if err := checkTenant(in.TenantID); err != nil {
		return err
	}
	if in.FromCheckpoint != "" {
		if err := checkID("from_checkpoint", "checkpoint", prefixCheckpoint, in.FromCheckpoint); err != nil {
			return err
		}
		if in.Template == "" {
			return nil
		}
	}
	return checkTemplate(in.Template)
}

func checkExec(in ExecIn) error {
	if err := checkID("sandbox_id", "sandbox", prefixSandbox, in.SandboxID); err != nil {
		return err
	}
	if len(in.Argv) == 0 {
		return errs.New(errs.InvalidInput, "argv: at least the program to run")
	}
	return checkNoSSHKey(in.Argv...)
}

func checkSandboxID(in SandboxIn) error {
	return checkID("sandbox_id", "sandbox", prefixSandbox, in.SandboxID)
}

func checkCheckpoint(in CheckpointIn) error {
	return checkID("sandbox_id", "sandbox", prefixSandbox, in.SandboxID)
}

func checkAuditList(in AuditListIn) error { return checkTenant(in.TenantID) }

func checkAuditProve(in AuditProveIn) error {
	if err := checkTenant(in.TenantID); err != nil {
		return err
	}
	return checkID("event_id", "audit event", prefixEvent, in.EventID)
}

func listNodes(ctx context.Context, api *client.Client, in TenantIn) (any, error) {
	var out struct {
		Nodes []client.Node `json:"nodes"`
	}
	err := api.Call(ctx, "nodes.list", map[string]any{"tenant_id": in.TenantID}, &out)
	return out, err
}

func showNode(ctx context.Context, api *client.Client, in NodeIn) (any, error) {
	var out client.Node
	err := api.Call(ctx, "nodes.get", map[string]any{"id": in.NodeID}, &out)
	return out, err
}

// waitFor returns the context a wait of seconds (0: the default) runs
// under.
func waitFor(ctx context.Context, seconds int64) (context.Context, context.CancelFunc) {
	if seconds == 0 {
		seconds = defaultWait
	}
	return context.WithTimeout(ctx, time.Duration(seconds)*time.Second)
}

// CommandOut is run_command's answer: the command as last read, and
// whether the wait ended before it was final.
type CommandOut struct {
	Command client.Command `json:"command"`
	Waiting bool           `json:"still_running"`
}

func (g *Gate) runCommand(ctx context.Context, api *client.Client, in RunCommandIn) (any, error) {
	cmd, err := api.CreateCommand(ctx, in.NodeID, in.Kind, payload(in.Payload))
	if err != nil {
		return nil, err
	}
	wctx, cancel := waitFor(ctx, in.TimeoutSeconds)
	defer cancel()
	for !cmd.Terminal() {
		if err := g.pause(wctx); err != nil {
			return CommandOut{Command: cmd, Waiting: true}, nil
		}
		next, err := api.Command(wctx, cmd.ID)
		if wctx.Err() != nil {
			return CommandOut{Command: cmd, Waiting: true}, nil
		}
		if err != nil {
			return nil, err
		}
		cmd = next
	}
	return CommandOut{Command: cmd}, nil
}

// FanoutOut is fanout_command's answer: the fan-out, its commands' counts
// by state as last read, and whether the wait ended before all were final.
type FanoutOut struct {
	Fanout  client.FanoutOut     `json:"fanout"`
	Summary client.FanoutSummary `json:"summary"`
	Waiting bool                 `json:"still_running"`
}

func (g *Gate) fanout(ctx context.Context, api *client.Client, in FanoutIn) (any, error) {
	req := client.FanoutIn{NodeIDs: in.NodeIDs, Labels: in.Labels, Kind: in.Kind, Payload: payload(in.Payload)}
	req.TenantID = in.TenantID
	fo, err := api.Fanout(ctx, req)
	if err != nil {
		return nil, err
	}
	fo.CommandIDs = nil // the summary counts them; the ids alone say little
	wctx, cancel := waitFor(ctx, in.TimeoutSeconds)
	defer cancel()
	out := FanoutOut{Fanout: fo, Waiting: true}
	for {
		s, err := api.FanoutSummary(wctx, fo.FanoutID)
		if wctx.Err() != nil {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out.Summary = s
		if s.Done() {
			out.Waiting = false
			return out, nil
		}
		if g.pause(wctx) != nil {
			return out, nil
		}
	}
}

// pause waits one poll interval, or until ctx ends.
func (g *Gate) pause(ctx context.Context) error {
	t := g.opts.Clock.NewTimer(g.opts.Poll)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}

func createSandbox(ctx context.Context, api *client.Client, in CreateSandboxIn) (any, error) {
	var out client.Sandbox
	err := api.Call(ctx, "sandboxes.create", map[string]any{"tenant_id": in.TenantID, "template": in.Template, "from_checkpoint": in.FromCheckpoint}, &out)
	return out, err
}

// ExecOut is exec_sandbox's answer, with the streams as text.
type ExecOut struct {
	SandboxID       string `json:"sandbox_id"`
	CommandID       string `json:"command_id"`
	Attested        bool   `json:"attested"`
	ExitCode        int    `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	TimedOut        bool   `json:"timed_out"`
}

func execSandbox(ctx context.Context, api *client.Client, in ExecIn) (any, error) {
	r, err := api.Exec(ctx, in.SandboxID, in.Argv, in.TimeoutSeconds)
	if err != nil {
		return nil, err
	}
	return ExecOut{SandboxID: r.SandboxID, CommandID: r.CommandID, Attested: r.Attested, ExitCode: r.ExitCode,
		Stdout: strings.ToValidUTF8(string(r.Stdout), "\uFFFD"), Stderr: strings.ToValidUTF8(string(r.Stderr), "\uFFFD"),
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated, TimedOut: r.TimedOut}, nil
}

func deleteSandbox(ctx context.Context, api *client.Client, in SandboxIn) (any, error) {
	freed, err := api.DeleteSandbox(ctx, in.SandboxID)
	return map[string]any{"sandbox_id": in.SandboxID, "freed": freed}, err
}

func checkpointSandbox(ctx context.Context, api *client.Client, in CheckpointIn) (any, error) {
	var out any
	err := api.Call(ctx, "sandboxes.checkpoint", map[string]any{"id": in.SandboxID, "memory": in.Memory}, &out)
	return out, err
}

func listAudit(ctx context.Context, api *client.Client, in AuditListIn) (any, error) {
	return api.AuditList(ctx, in.TenantID, in.Since, in.Limit)
}

func proveAudit(ctx context.Context, api *client.Client, in AuditProveIn) (any, error) {
	return api.AuditProve(ctx, in.TenantID, in.EventID)
}
