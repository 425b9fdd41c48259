package mcpgate

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bettercompute/bettercompute/client"
)

// fakeAPI is a working stand-in for the API envelope: it records every
// request and answers each method with answer (default: an empty object).
type fakeAPI struct {
	mu     sync.Mutex
	seen   []*http.Request
	answer func(method string, body []byte) (int, any)
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.seen = append(f.seen, r.Clone(context.Background()))
	answer := f.answer
	f.mu.Unlock()
	method := strings.TrimPrefix(r.URL.Path, "/api/v1/")
	status, v := http.StatusOK, any(map[string]any{})
	if answer != nil {
		status, v = answer(method, body)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// methods returns the API methods called so far, in order.
func (f *fakeAPI) methods() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, r := range f.seen {
		out = append(out, strings.TrimPrefix(r.URL.Path, "/api/v1/"))
	}
	return out
}

// apiError is the envelope's error body.
func apiError(code, msg string) any {
	return map[string]any{"error": map[string]any{"code": code, "message": msg, "request_id": "req_test"}}
}

// testDeadline bounds every wait of these tests.
const testDeadline = 20 * time.Second

// startStdio serves g over pipes as ServeStdio does for the CLI, with an
// API client of fake, and returns a connected SDK client session.
func startStdio(t *testing.T, g *Gate, fake http.Handler) *mcp.ClientSession {
	t.Helper()
	ts := httptest.NewServer(fake)
	t.Cleanup(ts.Close)
	ctx, cancel := context.WithCancel(context.Background())
	sr, cw := io.Pipe()
	cr, sw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- g.ServeStdio(ctx, client.New(ts.URL, "key-1"), sr, sw) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(ctx, &mcp.IOTransport{Reader: cr, Writer: cw}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() {
		_ = cs.Close()
		cancel()
		select {
		case <-done:
		case <-time.After(testDeadline):
			t.Error("ServeStdio did not return")
		}
	})
	return cs
}

// call calls a tool and returns its text and whether it is a tool error.
func call(t *testing.T, cs *mcp.ClientSession, tool string, args any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
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
