package mcpgate

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The tools' names. No tool approves, confirms or retries anything on the
// agent's behalf, and none takes or returns SSH keys.
const (
	ToolListNodes         = "list_nodes"
	ToolShowNode          = "show_node"
	ToolRunCommand        = "run_command"
	ToolFanoutCommand     = "fanout_command"
	ToolCreateSandbox     = "create_sandbox"
	ToolExecSandbox       = "exec_sandbox"
	ToolDeleteSandbox     = "delete_sandbox"
	ToolCheckpointSandbox = "checkpoint_sandbox"
	ToolListAuditEvents   = "list_audit_events"
	ToolProveAuditEvent   = "prove_audit_event"
)

// hints are a tool's MCP annotations.
func readOnly() *mcp.ToolAnnotations { return &mcp.ToolAnnotations{ReadOnlyHint: true} }

func mutates(destructive bool) *mcp.ToolAnnotations {
	return &mcp.ToolAnnotations{DestructiveHint: &destructive}
}

// addTools registers every tool on s.
func (g *Gate) addTools(s *mcp.Server, checks argsChecks, r resolver) {
	addTool(g, s, checks, r, &mcp.Tool{Name: ToolListNodes, Description: "List the nodes you can see (nodes.list).", Annotations: readOnly()},
		checkListNodes, listNodes)
	addTool(g, s, checks, r, &mcp.Tool{Name: ToolShowNode, Description: "Show one node by id (nodes.get).", Annotations: readOnly()},
		checkShowNode, showNode)
	addTool(g, s, checks, r, &mcp.Tool{Name: ToolRunCommand, Description: "Queue one non-destructive signed command for a node (commands.create) and wait for its attested result, up to timeout_seconds (default 60).", Annotations: mutates(false)},
		checkRunCommand, g.runCommand)
	addTool(g, s, checks, r, &mcp.Tool{Name: ToolFanoutCommand, Description: "Queue one non-destructive command for many nodes, by ids or labels (commands.fanout), and wait until all are final, up to timeout_seconds (default 60).", Annotations: mutates(false)},
		checkFanout, g.fanout)
	addTool(g, s, checks, r, &mcp.Tool{Name: ToolCreateSandbox, Description: "Create a sandbox from a template (name or id) or restore one of your checkpoints (sandboxes.create); answers once it runs.", Annotations: mutates(false)},
		checkCreateSandbox, createSandbox)
	addTool(g, s, checks, r, &mcp.Tool{Name: ToolExecSandbox, Description: "Run argv (no shell) in a sandbox and answer its exit code, stdout and stderr (sandboxes.exec).", Annotations: mutates(false)},
		checkExec, execSandbox)
	addTool(g, s, checks, r, &mcp.Tool{Name: ToolDeleteSandbox, Description: "Delete a sandbox (sandboxes.delete).", Annotations: mutates(true)},
		checkSandboxID, deleteSandbox)
	addTool(g, s, checks, r, &mcp.Tool{Name: ToolCheckpointSandbox, Description: "Checkpoint a sandbox's writable layer (sandboxes.checkpoint).", Annotations: mutates(false)},
		checkCheckpoint, checkpointSandbox)
	addTool(g, s, checks, r, &mcp.Tool{Name: ToolListAuditEvents, Description: "List a tenant's audit events (audit.list).", Annotations: readOnly()},
		checkAuditList, listAudit)
	addTool(g, s, checks, r, &mcp.Tool{Name: ToolProveAuditEvent, Description: "Answer one audit event's inclusion proof in its tenant's latest checkpoint (audit.prove).", Annotations: readOnly()},
		checkAuditProve, proveAudit)
}
