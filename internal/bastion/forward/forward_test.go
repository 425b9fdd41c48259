package forward

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

func modelNames(t *testing.T, body []byte) []string {
	t.Helper()
	var l struct {
		Models []struct{ Name, Model string }
		Data   []struct{ ID string }
	}
	if err := json.Unmarshal(body, &l); err != nil {
		t.Fatalf("list %q: %v", body, err)
	}
	var out []string
	for _, m := range l.Models {
		out = append(out, m.Name)
	}
	for _, d := range l.Data {
		out = append(out, d.ID)
	}
	return out
}

func TestModelListsRewrittenToScope(t *testing.T) {
	fo := newFakeOllama(t)
	r := startForward(t, KindOllama, fo.addr(), newPolicyBox(inference("llama3", "qwen2:7b")), nil, nil)
	for _, path := range []string{"/api/tags", "/api/ps", "/v1/models"} {
		st, body := r.do(t, "GET", path, "")
		if st != http.StatusOK {
			t.Fatalf("%s: %d %s", path, st, body)
		}
		if got, want := modelNames(t, body), []string{"llama3:latest", "qwen2:7b"}; !slices.Equal(got, want) {
			t.Errorf("%s: models %q, want %q", path, got, want)
		}
		if strings.Contains(string(body), "secret") {
			t.Errorf("%s: out-of-scope model named in %s", path, body)
		}
	}
}

func TestStorePathNeedsModelsFamily(t *testing.T) {
	fo := newFakeOllama(t)
	pol := newPolicyBox(inference("llama3"))
	r := startForward(t, KindOllama, fo.addr(), pol, nil, nil)
	st, body := r.do(t, "POST", "/api/pull", `{"model":"llama3"}`)
	wantRefusal(t, st, body, http.StatusForbidden, ReasonModelsNotGranted)
	if n := fo.pulls.Load(); n != 0 {
		t.Fatalf("refused pull reached the server %d times", n)
	}
	if r.audit.count(EventRefuse, ReasonModelsNotGranted) != 1 {
		t.Fatalf("no refuse event: %+v", r.audit.all())
	}
	pol.set(inferenceAndModels("llama3"))
	if st, body := r.do(t, "POST", "/api/pull", `{"model":"llama3"}`); st != http.StatusOK {
		t.Fatalf("granted pull: %d %s", st, body)
	}
	if n := fo.pulls.Load(); n != 1 {
		t.Fatalf("granted pull reached the server %d times", n)
	}
	st, body = r.do(t, "POST", "/api/pull", `{"model":"secret:70b"}`)
	wantRefusal(t, st, body, http.StatusForbidden, ReasonModelOutOfScope)
}

func TestGenerateHeldToModelScope(t *testing.T) {
	fo := newFakeOllama(t)
	r := startForward(t, KindOllama, fo.addr(), newPolicyBox(inference("llama3")), nil, nil)
	for _, body := range []string{
		`{"model":"secret:70b","prompt":"hi"}`,
		`{"model":"llama3","MODEL":"secret:70b"}`, // encoding/json would take the second
		`{"prompt":"no model"}`,
	} {
		st, resp := r.do(t, "POST", "/api/generate", body)
		wantRefusal(t, st, resp, http.StatusForbidden, ReasonModelOutOfScope)
	}
	if n := fo.generate.Load(); n != 0 {
		t.Fatalf("refused generate reached the server %d times", n)
	}
	st, resp := r.do(t, "POST", "/api/generate", `{"model":"llama3:latest","prompt":"hi"}`)
	if st != http.StatusOK || !strings.Contains(string(resp), `"model":"llama3:latest"`) {
		t.Fatalf("in-scope generate: %d %s", st, resp)
	}
	if n := fo.generate.Load(); n != 1 {
		t.Fatalf("in-scope generate reached the server %d times", n)
	}
}

func TestOtherRefusals(t *testing.T) {
	fo := newFakeOllama(t)
	r := startForward(t, KindOllama, fo.addr(), newPolicyBox(inference("llama3")), nil, nil)
	st, body := r.do(t, "POST", "/api/blobs/sha256:00", "x")
	wantRefusal(t, st, body, http.StatusForbidden, ReasonPathNotAllowed)
	st, body = r.do(t, "POST", "/api/../api/pull", `{"model":"llama3"}`)
	wantRefusal(t, st, body, http.StatusForbidden, ReasonPathNotAllowed)
	st, body = r.do(t, "POST", "/api/generate", "not json")
	wantRefusal(t, st, body, http.StatusBadRequest, ReasonMalformedBody)
	// Declared too large: refused before any of it is read.
	c, br := dialForward(t, r.addr)
	st, body = rawRequest(t, c, br, fmt.Sprintf("POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", MaxBodyBytes+1))
	wantRefusal(t, st, body, http.StatusRequestEntityTooLarge, ReasonBodyTooLarge)
	// Chunked, so found too large only while reading.
	c, br = dialForward(t, r.addr)
	chunk := strings.Repeat("a", MaxBodyBytes+1)
	st, body = rawRequest(t, c, br, fmt.Sprintf("POST /api/generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(chunk), chunk))
	wantRefusal(t, st, body, http.StatusRequestEntityTooLarge, ReasonBodyTooLarge)
	if n := r.audit.count(EventRefuse, ReasonBodyTooLarge); n != 2 {
		t.Fatalf("%d body-too-large events, want 2", n)
	}
	if n := fo.generate.Load(); n != 0 {
		t.Fatalf("refused requests reached the server %d times", n)
	}
}

func TestUpstreamUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	r := startForward(t, KindOllama, addr, newPolicyBox(inference("llama3")), nil, nil)
	st, body := r.do(t, "GET", "/api/version", "")
	wantRefusal(t, st, body, http.StatusBadGateway, ReasonUpstreamUnreachable)
}

func TestNoInferenceRefusedAtAccept(t *testing.T) {
	fo := newFakeOllama(t)
	pol := newPolicyBox(testPolicy{families: []string{FamilyModels}, models: []string{"llama3"}})
	r := startForward(t, KindOllama, fo.addr(), pol, nil, nil)
	st, body := r.do(t, "GET", "/api/tags", "")
	wantRefusal(t, st, body, http.StatusForbidden, ReasonInferenceNotGranted)
	evs := r.audit.all()
	if len(evs) != 1 || evs[0].Kind != EventRefuse || evs[0].Detail != "at accept" || evs[0].Lane != "inference/ollama" {
		t.Fatalf("events %+v, want one refusal at accept", evs)
	}
	if r.streams.Live() != 0 {
		t.Fatalf("refused connection holds a stream slot")
	}
}

func TestInferenceRevokedRefusedPerRequest(t *testing.T) {
	fo := newFakeOllama(t)
	pol := newPolicyBox(inference("llama3"))
	r := startForward(t, KindOllama, fo.addr(), pol, nil, nil)
	c, br := dialForward(t, r.addr)
	if st, _ := roundTrip(t, c, br, "GET", "/api/version"); st != http.StatusOK {
		t.Fatalf("first request: %d", st)
	}
	pol.set(testPolicy{})
	st, body := roundTrip(t, c, br, "GET", "/api/version")
	wantRefusal(t, st, body, http.StatusForbidden, ReasonInferenceNotGranted)
	if n := r.audit.count(EventAccept, ""); n != 1 {
		t.Fatalf("%d accept events for one connection, want 1", n)
	}
}

// dialForward opens a raw connection to the forward.
func dialForward(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}

// rawRequest writes req on c and reads one response.
func rawRequest(t *testing.T, c net.Conn, br *bufio.Reader, req string) (int, []byte) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// roundTrip sends one keep-alive request on c and reads its response.
func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, method, path string) (int, []byte) {
	t.Helper()
	return rawRequest(t, c, br, method+" "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
}

func TestSeventeenthStreamBusy(t *testing.T) {
	fo := newFakeOllama(t)
	r := startForward(t, KindOllama, fo.addr(), newPolicyBox(inference("llama3")), NewStreams(DefaultStreams), nil)
	conns := make([]net.Conn, 0, DefaultStreams)
	for i := range DefaultStreams {
		c, br := dialForward(t, r.addr)
		if st, _ := roundTrip(t, c, br, "GET", "/api/version"); st != http.StatusOK {
			t.Fatalf("stream %d: %d", i+1, st)
		}
		conns = append(conns, c)
	}
	c, br := dialForward(t, r.addr)
	st, body := roundTrip(t, c, br, "GET", "/api/version")
	wantRefusal(t, st, body, http.StatusServiceUnavailable, ReasonBusy)
	if n := r.audit.count(EventRefuse, ReasonBusy); n != 1 {
		t.Fatalf("%d busy events, want 1", n)
	}
	_ = conns[0].Close()
	waitFor(t, "the closed stream's slot", func() bool { return r.streams.Live() == DefaultStreams-1 })
	c, br = dialForward(t, r.addr)
	if st, body := roundTrip(t, c, br, "GET", "/api/version"); st != http.StatusOK {
		t.Fatalf("after a release: %d %s", st, body)
	}
}

func TestIdleStreamClosed(t *testing.T) {
	fo := newFakeOllama(t)
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	r := startForward(t, KindOllama, fo.addr(), newPolicyBox(inference("llama3")), nil, clk)
	c, br := dialForward(t, r.addr)
	if st, _ := roundTrip(t, c, br, "GET", "/api/version"); st != http.StatusOK {
		t.Fatal("first request failed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(9 * time.Minute)
	if st, _ := roundTrip(t, c, br, "GET", "/api/version"); st != http.StatusOK {
		t.Fatal("a stream idle 9 minutes was closed")
	}
	clk.Advance(9 * time.Minute) // 9 minutes after the last byte: still open
	if err := clk.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if r.streams.Live() != 1 {
		t.Fatal("a stream active 9 minutes ago was closed")
	}
	clk.Advance(time.Minute)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle stream: read %v %v, want EOF", n, err)
	}
	waitFor(t, "the idle stream's slot", func() bool { return r.streams.Live() == 0 })
}

func TestDialsOnlyCheckedAddresses(t *testing.T) {
	fo := newFakeOllama(t)
	_, port, _ := net.SplitHostPort(fo.addr())
	cfg := Config{
		Kind: KindOllama, Upstream: "models.invalid:" + port, Policy: newPolicyBox(inference("llama3")).get,
		Streams: NewStreams(1), Resolver: fakeResolver{netip.MustParseAddr("127.0.0.1")},
	}
	f, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	r := &running{f: f, addr: ln.Addr().String()}
	// The name does not resolve outside the checked answer: only the
	// checked address can reach the server.
	if st, body := r.do(t, "GET", "/api/version", ""); st != http.StatusOK {
		t.Fatalf("named upstream: %d %s", st, body)
	}
}

func TestProtocolSwitchRefused(t *testing.T) {
	var sawUpgrade atomic.Bool
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawUpgrade.Store(r.Header.Get("Upgrade") != "")
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "websocket")
		w.WriteHeader(http.StatusSwitchingProtocols)
	}))
	defer up.Close()
	r := startForward(t, KindPII, up.Listener.Addr().String(), newPolicyBox(inference()), nil, nil)
	c, br := dialForward(t, r.addr)
	st, body := rawRequest(t, c, br, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	wantRefusal(t, st, body, http.StatusBadGateway, ReasonUpstreamResponseRefused)
	if sawUpgrade.Load() {
		t.Fatal("the upgrade request reached the upstream")
	}
}
