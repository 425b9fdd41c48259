package mcpgate

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// holder keeps tool calls in flight until released: each held call
// reports on entered and waits for release (or its context).
type holder struct {
	entered chan string
	release chan struct{}
}

func newHolder() *holder {
	return &holder{entered: make(chan string, 16), release: make(chan struct{})}
}

func (h *holder) hold(ctx context.Context, tool string) {
	h.entered <- tool
	select {
	case <-h.release:
	case <-ctx.Done():
	}
}

// waitEntered waits until n calls are held.
func (h *holder) waitEntered(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(testDeadline)
	for i := 0; i < n; i++ {
		select {
		case <-h.entered:
		case <-deadline:
			t.Fatalf("only %d of %d calls in flight", i, n)
		}
	}
}

// TestInFlightLimit: one caller has at most 4 tool calls in flight; the
// 5th is refused at once (RATE_LIMITED, saying so) without reaching the
// API, and once one call ends the next is taken again.
func TestInFlightLimit(t *testing.T) {
	h := newHolder()
	fake := &fakeAPI{}
	cs := startStdio(t, New(Options{Hold: h.hold}), fake)
	done := make(chan string, MaxInFlight)
	for i := 0; i < MaxInFlight; i++ {
		go func() {
			text, _ := call(t, cs, ToolListNodes, nil)
			done <- text
		}()
	}
	h.waitEntered(t, MaxInFlight)
	text, isErr := call(t, cs, ToolShowNode, map[string]any{"node_id": goodNode})
	if !isErr || text != "RATE_LIMITED: too many tool calls in flight: at most 4 per caller; wait for one to finish" {
		t.Fatalf("5th call: %q (error %v)", text, isErr)
	}
	if got := fake.methods(); len(got) != 0 {
		t.Fatalf("held or refused calls reached the API: %v", got)
	}
	close(h.release)
	for i := 0; i < MaxInFlight; i++ {
		select {
		case text := <-done:
			if !strings.Contains(text, "nodes") {
				t.Fatalf("held call answered %q", text)
			}
		case <-time.After(testDeadline):
			t.Fatal("held calls never ended")
		}
	}
	if text, isErr := call(t, cs, ToolShowNode, map[string]any{"node_id": goodNode}); isErr {
		t.Fatalf("after the held calls ended: %q", text)
	}
}

// TestInFlightCountsPerCaller: the slots are counted per caller and
// given back exactly once.
func TestInFlightCountsPerCaller(t *testing.T) {
	f := newInFlight(MaxInFlight)
	var rel []func()
	for i := 0; i < MaxInFlight; i++ {
		r, ok := f.acquire("a")
		if !ok {
			t.Fatalf("slot %d refused", i+1)
		}
		rel = append(rel, r)
	}
	if _, ok := f.acquire("a"); ok {
		t.Fatal("a 5th slot was given")
	}
	rb, ok := f.acquire("b")
	if !ok {
		t.Fatal("another caller was refused")
	}
	rb()
	rel[0]()
	rel[0]() // a second release gives back nothing more
	if _, ok := f.acquire("a"); !ok {
		t.Fatal("a released slot was not given again")
	}
	if _, ok := f.acquire("a"); ok {
		t.Fatal("a double release gave back two slots")
	}
}

// TestNoSSHKeys: no tool takes SSH key material (an exec argv, a command
// payload, or a field the tool does not define is refused before the
// API) and none returns it (key fields are dropped and key text replaced
// in every answer).
func TestNoSSHKeys(t *testing.T) {
	const pub = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl agent@x"
	fake := &fakeAPI{answer: func(method string, _ []byte) (int, any) {
		switch method {
		case "sandboxes.exec":
			return http.StatusOK, map[string]any{"exit_code": 0, "stdout": []byte(pub + "\n"), "stderr": []byte("-----BEGIN OPENSSH PRIVATE KEY-----\n")}
		case "nodes.get":
			return http.StatusOK, map[string]any{"id": goodNode, "name": "web-1", "ssh_host_keys": []string{pub}, "inventory": map[string]any{"authorized_keys": pub, "note": pub, "cpu": "x86"}}
		}
		return http.StatusOK, map[string]any{}
	}}
	cs := startStdio(t, New(Options{}), fake)
	for _, args := range []struct {
		tool string
		in   map[string]any
	}{
		{ToolExecSandbox, map[string]any{"sandbox_id": goodSandbox, "argv": []string{"sh", "-c", "echo " + pub + " >> /root/.ssh/authorized_keys"}}},
		{ToolRunCommand, map[string]any{"node_id": goodNode, "kind": "diag.run", "payload": map[string]any{"key": pub}}},
		{ToolFanoutCommand, map[string]any{"node_ids": []string{goodNode}, "kind": "diag.run", "payload": map[string]any{"k": "-----BEGIN OPENSSH PRIVATE KEY-----"}}},
		// A bare key blob, without its type word.
		{ToolExecSandbox, map[string]any{"sandbox_id": goodSandbox, "argv": []string{"sh", "-c", "echo AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl >> k"}}},
		{ToolRunCommand, map[string]any{"node_id": goodNode, "kind": "diag.run", "payload": map[string]any{"key": "AAAAB3NzaC1yc2EAAAADAQABAAABAQC7"}}},
	} {
		if text, isErr := call(t, cs, args.tool, args.in); !isErr || text != errSSHKey.Error() {
			t.Errorf("%s with a key: %q, want %q", args.tool, text, errSSHKey.Error())
		}
	}
	if text, isErr := call(t, cs, ToolCreateSandbox, map[string]any{"template": "small", "ssh_authorized_keys": []string{pub}}); !isErr || !strings.Contains(text, "ssh_authorized_keys") {
		t.Errorf("an undefined ssh field was taken: %q", text)
	}
	if got := fake.methods(); len(got) != 0 {
		t.Fatalf("inputs with keys reached the API: %v", got)
	}
	for _, tc := range []struct {
		tool string
		in   map[string]any
	}{
		{ToolExecSandbox, map[string]any{"sandbox_id": goodSandbox, "argv": []string{"cat", "/etc/motd"}}},
		{ToolShowNode, map[string]any{"node_id": goodNode}},
	} {
		text, isErr := call(t, cs, tc.tool, tc.in)
		if isErr || strings.Contains(text, "AAAAC3NzaC1lZDI1NTE5") || strings.Contains(text, "PRIVATE KEY") || strings.Contains(text, "ssh_host_keys") ||
			strings.Contains(text, "authorized_keys") || !strings.Contains(text, removedSSH) {
			t.Errorf("%s returned key material: %s", tc.tool, text)
		}
	}
}

// TestHTTPGoesThroughTheEnvelope: over streamable HTTP every tool call
// reaches the API handler as an ordinary API request (POST
// /api/v1/<method>, JSON, X-Better-Compute: 1, the caller's own bearer
// key, the caller's address) and nothing else of the MCP request (no
// cookie); a request with no key, or a key the API does not
// authenticate, is refused 401 UNAUTHENTICATED and no tool runs.
func TestHTTPGoesThroughTheEnvelope(t *testing.T) {
	fake := &fakeAPI{answer: func(method string, _ []byte) (int, any) {
		return http.StatusOK, map[string]any{"identity_id": "iaaaaaaaaaaaaaaaa", "nodes": []any{}}
	}}
	var peer string
	gate := New(Options{}).HTTP(fake)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer = r.RemoteAddr
		Route(http.NotFoundHandler(), gate).ServeHTTP(w, r)
	}))
	defer ts.Close()
	cs := connectHTTP(t, ts.URL+Path, "Bearer key-1")
	if text, isErr := call(t, cs, ToolListNodes, nil); isErr {
		t.Fatalf("list_nodes: %s", text)
	}
	fake.mu.Lock()
	seen := fake.seen
	fake.mu.Unlock()
	var methods []string
	for _, r := range seen {
		methods = append(methods, r.URL.Path)
		if r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer key-1" || r.Header.Get("X-Better-Compute") != "1" ||
			r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Cookie") != "" || r.RemoteAddr != peer {
			t.Fatalf("the API saw %s %s %v from %s (MCP peer %s)", r.Method, r.URL.Path, r.Header, r.RemoteAddr, peer)
		}
	}
	if !strings.Contains(strings.Join(methods, " "), "/api/v1/nodes.list") {
		t.Fatalf("the API saw %v", methods)
	}
	// Through a proxy on the same machine the Host is the public name.
	if code := postInitialize(t, ts.URL+Path, "Bearer key-1", "bc.example.com"); code != http.StatusOK {
		t.Fatalf("a request for the proxy's host name: %d, want 200", code)
	}
	// No key, another scheme, or a key the API refuses: 401.
	fake.mu.Lock()
	fake.answer = func(string, []byte) (int, any) {
		return http.StatusUnauthorized, apiError("UNAUTHENTICATED", "invalid credentials")
	}
	fake.seen = nil
	fake.mu.Unlock()
	for _, authz := range []string{"", "Basic a2V5", "Bearer ", "Bearer wrong"} {
		if code := postInitialize(t, ts.URL+Path, authz, ""); code != http.StatusUnauthorized {
			t.Errorf("Authorization %q: %d, want 401", authz, code)
		}
	}
	if got := fake.methods(); len(got) != 1 || got[0] != "identities.whoami" {
		t.Fatalf("refused requests called %v, want one whoami (for the wrong key)", got)
	}
}

// postInitialize posts an MCP initialize to url with authz and host (""
// for none) and returns the status; a 401 must carry WWW-Authenticate and
// the API's UNAUTHENTICATED error.
func postInitialize(t *testing.T, url, authz, host string) int {
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
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized {
		var eb struct{ Error struct{ Code string } }
		if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil || eb.Error.Code != "UNAUTHENTICATED" || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("401 with code %q (%v), WWW-Authenticate %q", eb.Error.Code, err, resp.Header.Get("WWW-Authenticate"))
		}
	}
	return resp.StatusCode
}

// connectHTTP connects an SDK client to url sending authz.
func connectHTTP(t *testing.T, url, authz string) *mcp.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: headerTransport{authz: authz}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// headerTransport adds an Authorization header and a cookie to every
// request (the cookie must never reach the API).
type headerTransport struct{ authz string }

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", h.authz)
	r.Header.Set("Cookie", "bc_session=stolen")
	return http.DefaultTransport.RoundTrip(r)
}
