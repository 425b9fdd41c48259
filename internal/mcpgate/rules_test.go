package mcpgate

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

const (
	goodNode    = "naaaaaaaaaaaaaaaa"
	goodSandbox = "sbxaaaaaaaaaaaaaaaa"
	goodEvent   = "ev_aaaaaaaaaaaaaaaa"
	goodCkpt    = "ckpaaaaaaaaaaaaaaaa"
)

// finalAnswers answer the waits at once: every command is final.
func finalAnswers(method string, _ []byte) (int, any) {
	switch method {
	case "commands.create":
		return http.StatusOK, map[string]any{"id": "caaaaaaaaaaaaaaaa", "state": "succeeded"}
	case "commands.fanout":
		return http.StatusOK, map[string]any{"fanout_id": "foaaaaaaaaaaaaaaaa", "count": 1, "command_ids": []string{"caaaaaaaaaaaaaaaa"}}
	case "commands.fanoutSummary":
		return http.StatusOK, map[string]any{"fanout_id": "foaaaaaaaaaaaaaaaa", "total": 1, "states": map[string]int{"succeeded": 1}}
	}
	return http.StatusOK, map[string]any{}
}

// TestIDsMustBeWellFormed: every tool refuses an id that is not one the
// control plane makes (wrong prefix, length or alphabet, a path, a
// control character) with INVALID_INPUT before anything reaches the API;
// the same call with a well-formed id reaches exactly its API method.
func TestIDsMustBeWellFormed(t *testing.T) {
	bad := []string{"", "n", "naaaaaaaaaaaaaaa", "naaaaaaaaaaaaaaaaa", "nAAAAAAAAAAAAAAAA", "n1aaaaaaaaaaaaaaa", "../etc/passwd", "naaaaaaaaaaaaaaa\n", "sbxaaaaaaaaaaaaaaaa"}
	cases := []struct {
		tool, method string
		args         func(id string) map[string]any
	}{
		{ToolShowNode, "nodes.get", func(id string) map[string]any { return map[string]any{"node_id": id} }},
		{ToolRunCommand, "commands.create", func(id string) map[string]any { return map[string]any{"node_id": id, "kind": "node.ping"} }},
		{ToolFanoutCommand, "commands.fanout", func(id string) map[string]any {
			return map[string]any{"node_ids": []string{goodNode, id}, "kind": "node.ping"}
		}},
		{ToolExecSandbox, "sandboxes.exec", func(id string) map[string]any { return map[string]any{"sandbox_id": sbx(id), "argv": []string{"true"}} }},
		{ToolDeleteSandbox, "sandboxes.delete", func(id string) map[string]any { return map[string]any{"sandbox_id": sbx(id)} }},
		{ToolCheckpointSandbox, "sandboxes.checkpoint", func(id string) map[string]any { return map[string]any{"sandbox_id": sbx(id)} }},
		{ToolCreateSandbox, "sandboxes.create", func(id string) map[string]any {
			return map[string]any{"from_checkpoint": "ckp" + strings.TrimPrefix(id, "n")}
		}},
		{ToolProveAuditEvent, "audit.prove", func(id string) map[string]any { return map[string]any{"event_id": "ev_" + strings.TrimPrefix(id, "n")} }},
		{ToolListAuditEvents, "audit.list", func(id string) map[string]any { return map[string]any{"tenant_id": "t" + strings.TrimPrefix(id, "n")} }},
		{ToolListNodes, "nodes.list", func(id string) map[string]any { return map[string]any{"tenant_id": "t" + strings.TrimPrefix(id, "n")} }},
	}
	fake := &fakeAPI{answer: finalAnswers}
	cs := startStdio(t, New(Options{}), fake)
	for _, c := range cases {
		for _, id := range bad {
			if c.tool == ToolListNodes || c.tool == ToolListAuditEvents {
				if id == "" {
					continue // the caller's own tenant
				}
			}
			text, isErr := call(t, cs, c.tool, c.args(id))
			if !isErr || !strings.HasPrefix(text, "INVALID_INPUT: ") || !strings.Contains(text, "well-formed") {
				t.Errorf("%s with id %q: %q (error %v), want INVALID_INPUT not well-formed", c.tool, id, text, isErr)
			}
		}
		if got := fake.methods(); len(got) != 0 {
			t.Fatalf("%s: malformed ids reached the API: %v", c.tool, got)
		}
		if text, isErr := call(t, cs, c.tool, c.args(goodNode)); isErr {
			t.Fatalf("%s with well-formed ids: %s", c.tool, text)
		}
		if got := fake.methods(); len(got) == 0 || got[0] != c.method {
			t.Fatalf("%s called %v, want %s first", c.tool, got, c.method)
		}
		fake.mu.Lock()
		fake.seen = nil
		fake.mu.Unlock()
	}
}

// sbx turns a node-shaped test id into the same shape for a sandbox; the
// last bad id (a sandbox id) stays as it is, so that one is refused as a
// node and these turn into a node id, refused as a sandbox.
func sbx(id string) string {
	if rest, ok := strings.CutPrefix(id, "n"); ok && id != "n" {
		return "sbx" + rest
	}
	if strings.HasPrefix(id, "sbx") {
		return goodNode
	}
	return id
}

// TestTemplateNamesAndTenants: a template is a template id or a valid
// name, a tenant empty, the root tenant or a tenant id; anything else is
// refused before the API.
func TestTemplateNamesAndTenants(t *testing.T) {
	for _, tc := range []struct {
		tpl, tenant string
		ok          bool
	}{
		{"small", "", true}, {"tplaaaaaaaaaaaaaaaa", "taaaaaaaaaaaaaaaa", true}, {"small", "root", false},
		{"../x", "", false}, {"small", "acme", false}, {"", "", false}, {"a b", "", false},
	} {
		errT := checkCreateSandbox(CreateSandboxIn{Template: tc.tpl, TenantID: tc.tenant})
		if (errT == nil) != tc.ok || errT != nil && !strings.HasPrefix(errT.Error(), "INVALID_INPUT: ") {
			t.Errorf("template %q tenant %q: %v, want ok=%v", tc.tpl, tc.tenant, errT, tc.ok)
		}
	}
	if err := checkCreateSandbox(CreateSandboxIn{FromCheckpoint: goodCkpt}); err != nil {
		t.Errorf("a restore without a template: %v", err)
	}
}

// TestDestructiveKindsRefused: run_command and fanout_command refuse every
// destructive kind (and the module kinds, such as ssh.access, which
// carries keys) before the API; node.ping goes through.
func TestDestructiveKindsRefused(t *testing.T) {
	fake := &fakeAPI{answer: finalAnswers}
	cs := startStdio(t, New(Options{}), fake)
	for _, kind := range []string{"node.reboot", "disk.wipe", "gpu.reset", "bmc.powerCycle"} {
		for _, tool := range []string{ToolRunCommand, ToolFanoutCommand} {
			args := map[string]any{"node_ids": []string{goodNode}, "kind": kind}
			if tool == ToolRunCommand {
				args = map[string]any{"node_id": goodNode, "kind": kind}
			}
			text, isErr := call(t, cs, tool, args)
			want := "ACCESS_DENIED: kind: destructive kinds are not run through the MCP gate"
			if kind == "bmc.powerCycle" {
				want = "INVALID_INPUT: kind: not a command kind this release defines"
			}
			if !isErr || text != want {
				t.Errorf("%s %s: %q, want %q", tool, kind, text, want)
			}
		}
	}
	if text, isErr := call(t, cs, ToolRunCommand, map[string]any{"node_id": goodNode, "kind": "ssh.access"}); !isErr || !strings.HasPrefix(text, "INVALID_INPUT: kind: made by its module") {
		t.Errorf("ssh.access: %q", text)
	}
	if got := fake.methods(); len(got) != 0 {
		t.Fatalf("refused kinds reached the API: %v", got)
	}
	if text, isErr := call(t, cs, ToolRunCommand, map[string]any{"node_id": goodNode, "kind": "node.ping"}); isErr || !strings.Contains(text, `"state":"succeeded"`) {
		t.Fatalf("node.ping: %q", text)
	}
}

// TestConfirmationGoesToThePerson: when the API holds a request back for
// its person (CONFIRMATION_REQUIRED), the tool answers a tool error with
// the API's code and message verbatim and says a person must approve; the
// gate called nothing else (no approval, no retry), and no tool of the
// gate approves or confirms anything.
func TestConfirmationGoesToThePerson(t *testing.T) {
	fake := &fakeAPI{answer: func(method string, _ []byte) (int, any) {
		return http.StatusConflict, apiError(CodeConfirmationRequired, "held for your person: request apr_x creates a sandbox of template small")
	}}
	cs := startStdio(t, New(Options{}), fake)
	text, isErr := call(t, cs, ToolCreateSandbox, map[string]any{"template": "small"})
	if !isErr || !strings.HasPrefix(text, "CONFIRMATION_REQUIRED: held for your person: request apr_x creates a sandbox of template small (request req_test)") ||
		!strings.Contains(text, "a person must approve this request") || !strings.Contains(text, "cannot approve it for you") {
		t.Fatalf("held-back create: %q (error %v)", text, isErr)
	}
	if got := fake.methods(); !slices.Equal(got, []string{"sandboxes.create"}) {
		t.Fatalf("the gate called %v, want only sandboxes.create", got)
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		for _, w := range []string{"approv", "confirm", "batch", "sign"} {
			if strings.Contains(strings.ToLower(tl.Name), w) {
				t.Errorf("tool %s can answer a confirmation", tl.Name)
			}
		}
	}
	want := []string{ToolCheckpointSandbox, ToolCreateSandbox, ToolDeleteSandbox, ToolExecSandbox, ToolFanoutCommand, ToolListAuditEvents, ToolListNodes, ToolProveAuditEvent, ToolRunCommand, ToolShowNode}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
	// Any other error answer passes through verbatim too.
	fake.mu.Lock()
	fake.answer = func(string, []byte) (int, any) { return http.StatusNotFound, apiError("NOT_FOUND", "no such sandbox") }
	fake.mu.Unlock()
	if text, _ := call(t, cs, ToolDeleteSandbox, map[string]any{"sandbox_id": goodSandbox}); text != "NOT_FOUND: no such sandbox (request req_test)" {
		t.Fatalf("NOT_FOUND answered %q", text)
	}
}

// TestArgumentsDecodeStrictly: a tool's arguments with a key twice, or a
// number its field cannot hold, are refused INVALID_INPUT naming the key
// or field by its JSON name (never a Go type, as the SDK's own decoding
// error would), before anything reaches the API, as the API refuses such
// a body.
func TestArgumentsDecodeStrictly(t *testing.T) {
	fake := &fakeAPI{answer: finalAnswers}
	cs := startStdio(t, New(Options{}), fake)
	for _, c := range []struct {
		tool string
		args json.RawMessage
		want string
	}{
		{ToolListAuditEvents, json.RawMessage(`{"limit":1e20}`), `INVALID_INPUT: field "limit": wrong type or out of range`},
		{ToolListAuditEvents, json.RawMessage(`{"since":"x"}`), `INVALID_INPUT: field "since": wrong type or out of range`},
		{ToolListNodes, json.RawMessage(`{"tenant_id":"root","tenant_id":"tbbbbbbbbbbbbbbbb"}`), `INVALID_INPUT: duplicate key "tenant_id"`},
		{ToolRunCommand, json.RawMessage(`{"node_id":"` + goodNode + `","kind":"node.ping","payload":{"a":1,"a":2}}`), `INVALID_INPUT: duplicate key "a"`},
		{ToolListNodes, json.RawMessage(`{"tenant_id":"root\ud800"}`), `INVALID_INPUT: the arguments object is not valid UTF-8`},
		{ToolRunCommand, json.RawMessage(`{"node_id":"` + goodNode + `","kind":"node.ping","payload":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`),
			`INVALID_INPUT: the arguments object nests too deeply`},
	} {
		text, isErr := call(t, cs, c.tool, c.args)
		if !isErr || text != c.want {
			t.Errorf("%s %s: %q (error %v), want %q", c.tool, c.args, text, isErr, c.want)
		}
	}
	if got := fake.methods(); len(got) != 0 {
		t.Fatalf("refused arguments reached the API: %v", got)
	}
}
