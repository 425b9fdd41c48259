package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/cli"
	"github.com/bettercompute/bettercompute/internal/mcpgate"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// startMCPCommand runs `better-compute mcp` (the CLI's own command, with
// the API address and key from the environment as a user sets them) over
// pipes and connects the MCP Go SDK's client to it.
func startMCPCommand(t *testing.T, addr, key string) *mcp.ClientSession {
	t.Helper()
	t.Setenv("BC_ADDR", addr)
	t.Setenv("BC_API_KEY", key)
	t.Setenv("BC_API_KEY_FILE", "")
	t.Setenv("BC_CA_FILE", "")
	sr, cw := io.Pipe()
	cr, sw := io.Pipe()
	var stderr bytes.Buffer
	root := cli.NewRoot()
	root.SetArgs([]string{"mcp"})
	root.SetIn(sr)
	root.SetOut(sw)
	root.SetErr(&stderr)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- root.ExecuteContext(ctx)
		_ = sw.Close()
	}()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent"}, nil).Connect(ctx, &mcp.IOTransport{Reader: cr, Writer: cw}, nil)
	if err != nil {
		cancel()
		t.Fatalf("connect to better-compute mcp: %v (stderr %s)", err, stderr.String())
	}
	t.Cleanup(func() {
		_ = cs.Close()
		cancel()
		select {
		case <-done:
		case <-time.After(testenv.WaitTimeout):
			t.Error("better-compute mcp did not end when its input closed")
		}
	})
	return cs
}

// mcpCall calls a tool and returns its text and whether it is a tool error.
func mcpCall(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.WaitTimeout)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error %v", tool, err)
	}
	var text []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text = append(text, tc.Text)
		}
	}
	return strings.Join(text, "\n"), res.IsError
}

// mcpDecode calls a tool that must succeed and decodes its answer.
func mcpDecode(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any, out any) {
	t.Helper()
	text, isErr := mcpCall(t, cs, tool, args)
	if isErr {
		t.Fatalf("%s: %s", tool, text)
	}
	if err := json.Unmarshal([]byte(text), out); err != nil {
		t.Fatalf("%s answered %q: %v", tool, text, err)
	}
}

// TestMCPGateOverStdio drives `better-compute mcp` with the Go SDK's
// client as a tenant's agent: it lists the tools, creates a sandbox, runs
// `echo hi` in it and reads hi, and deletes it. Four run_command calls on
// a node of the tenant that is not connected stay in flight (their
// commands queued); a 5th call is refused at once with RATE_LIMITED, and
// once the four end (their commands cancelled) calls are taken again.
func TestMCPGateOverStdio(t *testing.T) {
	s := startSandboxes(t, storetest.NewTestSQLite(t), nil, 0)
	cs := startMCPCommand(t, s.APIURL(), s.admin.Key())
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	for _, want := range []string{mcpgate.ToolListNodes, mcpgate.ToolShowNode, mcpgate.ToolRunCommand, mcpgate.ToolFanoutCommand, mcpgate.ToolCreateSandbox,
		mcpgate.ToolExecSandbox, mcpgate.ToolDeleteSandbox, mcpgate.ToolCheckpointSandbox, mcpgate.ToolListAuditEvents, mcpgate.ToolProveAuditEvent} {
		if !slices.Contains(names, want) {
			t.Fatalf("tools %v lack %s", names, want)
		}
	}
	var x client.Sandbox
	mcpDecode(t, cs, mcpgate.ToolCreateSandbox, map[string]any{"template": "small"}, &x)
	var r mcpgate.ExecOut
	mcpDecode(t, cs, mcpgate.ToolExecSandbox, map[string]any{"sandbox_id": x.ID, "argv": []string{"echo", "hi"}}, &r)
	if r.Stdout != "hi\n" || r.ExitCode != 0 || !r.Attested {
		t.Fatalf("echo hi answered %+v", r)
	}
	mcpInFlight(t, s, cs)
	if text, isErr := mcpCall(t, cs, mcpgate.ToolDeleteSandbox, map[string]any{"sandbox_id": x.ID}); isErr {
		t.Fatalf("delete: %s", text)
	}
}

// mcpInFlight holds four calls in flight on an idle node of the tenant and
// checks the 5th is refused.
func mcpInFlight(t *testing.T, s sandboxEnv, cs *mcp.ClientSession) {
	t.Helper()
	ctx := context.Background()
	idle := admitJoinNode(t, s.Env, s.tenant, pki.RoleNodeTenant, "idle")
	var wg sync.WaitGroup
	answers := make(chan string, mcpgate.MaxInFlight)
	for i := 0; i < mcpgate.MaxInFlight; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			text, _ := mcpCall(t, cs, mcpgate.ToolRunCommand, map[string]any{"node_id": idle, "kind": "node.ping", "timeout_seconds": 600})
			answers <- text
		}()
	}
	queued := waitQueued(t, s.admin, idle, mcpgate.MaxInFlight)
	text, isErr := mcpCall(t, cs, mcpgate.ToolListNodes, nil)
	if !isErr || !strings.HasPrefix(text, "RATE_LIMITED: too many tool calls in flight: at most 4 per caller") {
		t.Fatalf("the 5th concurrent call: %q (error %v), want RATE_LIMITED", text, isErr)
	}
	for _, c := range queued {
		if err := s.admin.Call(ctx, "commands.cancel", map[string]any{"id": c.ID}, nil); err != nil {
			t.Fatalf("cancel %s: %v", c.ID, err)
		}
	}
	wg.Wait()
	close(answers)
	for a := range answers {
		if !strings.Contains(a, `"state":"cancelled"`) {
			t.Fatalf("a held call answered %q, want its command cancelled", a)
		}
	}
	if text, isErr := mcpCall(t, cs, mcpgate.ToolListNodes, nil); isErr || !strings.Contains(text, idle) {
		t.Fatalf("after the held calls ended: %q", text)
	}
}

// waitQueued waits until node has n queued commands and returns them.
func waitQueued(t *testing.T, admin *client.Client, node string, n int) []client.Command {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(testenv.WaitTimeout)
	for {
		cmds, err := admin.Commands(context.Background(), client.CommandListIn{NodeID: node, State: "queued"})
		if err != nil {
			t.Fatal(err)
		}
		if len(cmds) >= n {
			return cmds
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%d of %d commands queued", len(cmds), n)
		}
	}
}

// TestMCPGateOverHTTP: the api role serves the gate at /mcp. An agent
// with its API key lists its own nodes and reads one; a node of another
// tenant is refused with exactly the API's answer, and a key whose identity
// has no binding is refused ACCESS_DENIED by the same IAM decision. A
// request without a key, or with a key the API does not know, is refused
// 401 UNAUTHENTICATED.
func TestMCPGateOverHTTP(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1})
	tenant, admin := e.TenantAdmin(t, "acme")
	mine := joinTenantNode(t, e, tenant, "box")
	cs := connectMCPHTTP(t, e.APIURL()+mcpgate.Path, "Bearer "+admin.Key())
	var list struct{ Nodes []client.Node }
	mcpDecode(t, cs, mcpgate.ToolListNodes, nil, &list)
	if len(list.Nodes) != 1 || list.Nodes[0].ID != mine.NodeID() {
		t.Fatalf("the agent lists %+v, want only its node", list.Nodes)
	}
	var n client.Node
	mcpDecode(t, cs, mcpgate.ToolShowNode, map[string]any{"node_id": mine.NodeID()}, &n)
	if n.ID != mine.NodeID() || n.TenantID != tenant {
		t.Fatalf("show_node: %+v", n)
	}
	var viaAPI *client.Error
	if err := admin.Call(context.Background(), "nodes.get", map[string]any{"id": e.Nodes[0].NodeID()}, nil); !errors.As(err, &viaAPI) || viaAPI.Code != "ACCESS_DENIED" {
		t.Fatalf("the API answers another tenant's node %v", err)
	}
	text, isErr := mcpCall(t, cs, mcpgate.ToolShowNode, map[string]any{"node_id": e.Nodes[0].NodeID()})
	if !isErr || !strings.HasPrefix(text, "ACCESS_DENIED: "+viaAPI.Message+" (request ") {
		t.Fatalf("another tenant's node: %q, want the API's answer %q", text, viaAPI.Message)
	}
	unbound := e.IdentityClient(t, tenant, "nobody", "")
	cs2 := connectMCPHTTP(t, e.APIURL()+mcpgate.Path, "Bearer "+unbound.Key())
	if text, isErr := mcpCall(t, cs2, mcpgate.ToolListNodes, nil); !isErr || !strings.HasPrefix(text, "ACCESS_DENIED: ") {
		t.Fatalf("an identity without a binding: %q, want ACCESS_DENIED", text)
	}
	for _, authz := range []string{"", "Bearer bc_not_a_key"} {
		if code := postMCP(t, e.APIURL()+mcpgate.Path, authz); code != http.StatusUnauthorized {
			t.Fatalf("Authorization %q: %d, want 401", authz, code)
		}
	}
}

// connectMCPHTTP connects the SDK's streamable HTTP client sending authz.
func connectMCPHTTP(t *testing.T, url, authz string) *mcp.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: authTransport{authz: authz}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// authTransport sets the Authorization header of every request.
type authTransport struct{ authz string }

func (a authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", a.authz)
	return http.DefaultTransport.RoundTrip(r)
}

// postMCP posts an initialize to url with authz ("" for none), checks a
// refusal's body is the API's UNAUTHENTICATED error, and returns the
// status.
func postMCP(t *testing.T, url, authz string) int {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb struct{ Error struct{ Code string } }
	if resp.StatusCode != http.StatusOK && (json.NewDecoder(resp.Body).Decode(&eb) != nil || eb.Error.Code != "UNAUTHENTICATED") {
		t.Fatalf("Authorization %q: refused %d with code %q, want UNAUTHENTICATED", authz, resp.StatusCode, eb.Error.Code)
	}
	return resp.StatusCode
}
