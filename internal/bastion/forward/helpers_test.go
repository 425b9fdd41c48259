package forward

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// testPolicy is a fixed grant: its families and its exact model names.
type testPolicy struct {
	families []string
	models   []string
}

func (p testPolicy) Allows(f string) bool       { return slices.Contains(p.families, f) }
func (p testPolicy) ModelInScope(m string) bool { return slices.Contains(p.models, m) }
func (p testPolicy) Models() []string           { return slices.Sorted(slices.Values(p.models)) }
func inference(models ...string) testPolicy     { return testPolicy{[]string{FamilyInference}, models} }
func inferenceAndModels(models ...string) testPolicy {
	return testPolicy{[]string{FamilyInference, FamilyModels}, models}
}

// policyBox is a grant the test changes while the forward runs.
type policyBox struct{ p atomic.Pointer[testPolicy] }

func newPolicyBox(p testPolicy) *policyBox { b := &policyBox{}; b.set(p); return b }
func (b *policyBox) set(p testPolicy)      { b.p.Store(&p) }
func (b *policyBox) get() Policy           { return *b.p.Load() }

// fakeOllama is a local ollama stand-in that counts what reached it.
type fakeOllama struct {
	srv      *httptest.Server
	pulls    atomic.Int32
	generate atomic.Int32
}

const tagsBody = `{"models":[` +
	`{"name":"llama3:latest","model":"llama3:latest","size":1,"details":{"family":"llama","parent_model":"secret:70b"}},` +
	`{"name":"qwen2:7b","model":"qwen2:7b"},` +
	`{"name":"secret:70b","model":"secret:70b"}]}`

const v1ModelsBody = `{"object":"list","data":[` +
	`{"id":"llama3:latest","object":"model"},{"id":"qwen2:7b","object":"model","parent":"secret:70b"},` +
	`{"id":"secret:70b","object":"model"}]}`

func newFakeOllama(t *testing.T) *fakeOllama {
	t.Helper()
	fo := &fakeOllama{}
	mux := http.NewServeMux()
	mux.HandleFunc("/api/tags", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, tagsBody) })
	mux.HandleFunc("/api/ps", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, tagsBody) })
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, v1ModelsBody) })
	mux.HandleFunc("/api/version", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, `{"version":"0.0.0"}`) })
	mux.HandleFunc("/api/pull", func(w http.ResponseWriter, r *http.Request) {
		fo.pulls.Add(1)
		_, _ = io.WriteString(w, `{"status":"success"}`)
	})
	mux.HandleFunc("/api/generate", func(w http.ResponseWriter, r *http.Request) {
		fo.generate.Add(1)
		var req struct {
			Model string `json:"model"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		_ = json.NewEncoder(w).Encode(map[string]string{"model": req.Model, "response": "ok"})
	})
	fo.srv = httptest.NewServer(mux)
	t.Cleanup(fo.srv.Close)
	return fo
}

func (fo *fakeOllama) addr() string { return fo.srv.Listener.Addr().String() }

// auditLog collects the forward's events.
type auditLog struct {
	mu     sync.Mutex
	events []Event
}

func (a *auditLog) add(e Event) { a.mu.Lock(); a.events = append(a.events, e); a.mu.Unlock() }

func (a *auditLog) all() []Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.events)
}

func (a *auditLog) count(kind string, reason Reason) int {
	n := 0
	for _, e := range a.all() {
		if e.Kind == kind && e.Reason == string(reason) {
			n++
		}
	}
	return n
}

// running is a forward serving on a loopback listener.
type running struct {
	f       *Forward
	addr    string
	audit   *auditLog
	streams *Streams
}

// startForward runs a forward of kind to upstream under pol until the
// test ends. clk may be nil (wall clock).
func startForward(t *testing.T, kind Kind, upstream string, pol *policyBox, streams *Streams, clk clock.Clock) *running {
	t.Helper()
	if streams == nil {
		streams = NewStreams(DefaultStreams)
	}
	al := &auditLog{}
	cfg := Config{Kind: kind, Upstream: upstream, Policy: pol.get, Streams: streams, Clock: clk, Audit: al.add}
	f, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return &running{f: f, addr: ln.Addr().String(), audit: al, streams: streams}
}

// do sends one request on a fresh connection and returns the status and
// body.
func (r *running) do(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+r.addr+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// wantRefusal checks a refusal's status and JSON body.
func wantRefusal(t *testing.T, status int, body []byte, wantStatus int, want Reason) {
	t.Helper()
	var e struct {
		Error struct{ Code, Reason string }
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("refusal body %q: %v", body, err)
	}
	if status != wantStatus || e.Error.Code != "ACCESS_DENIED" || e.Error.Reason != string(want) {
		t.Fatalf("got %d %s, want %d reason %q", status, body, wantStatus, want)
	}
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // poll with a deadline
	}
}
