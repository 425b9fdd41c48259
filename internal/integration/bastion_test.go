package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/bastion/agent"
	"github.com/bettercompute/bettercompute/internal/bastion/forward"
	"github.com/bettercompute/bettercompute/internal/bastion/grant"
	"github.com/bettercompute/bettercompute/internal/cli"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// fakeOllama is a local HTTP server answering as Ollama does on the paths
// the test uses: three models listed, pulls succeed, generate echoes the
// model it was asked for.
func fakeOllama(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/api/tags", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"models":[{"name":"llama3:8b","model":"llama3:8b"},{"name":"qwen2:7b","model":"qwen2:7b"},{"name":"secret:70b","model":"secret:70b"}]}`)
	})
	mux.HandleFunc("/api/pull", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{"status":"success"}`) })
	mux.HandleFunc("/api/version", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{"version":"0.0.0-fake"}`) })
	mux.HandleFunc("/api/generate", func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Model string }
		_ = json.NewDecoder(r.Body).Decode(&in)
		fmt.Fprintf(w, `{"model":%q,"response":"hi"}`, in.Model)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// bastionEnv starts a control plane with the lanes role on loopback.
func bastionEnv(t *testing.T, db *store.DB) *testenv.Env {
	t.Helper()
	return testenv.Start(t, db, testenv.Options{Tune: func(o *server.Options) {
		o.Roles = []string{server.RoleAPI, server.RoleGateway, server.RoleWorkers, server.RoleLanes}
		o.LanesListen = "127.0.0.1:0"
	}})
}

// pairBastion pairs a bastion in a new data folder with forwards and
// runs it until the test ends; it returns once the tunnel had its first
// handshake.
func pairBastion(t *testing.T, e *testenv.Env, forwards map[forward.Kind]string) *agent.Agent {
	t.Helper()
	return pairBastionWith(t, e, agent.Config{Forwards: forwards})
}

// pairBastionWith is pairBastion with the agent's configuration (its data
// folder and log are filled in).
func pairBastionWith(t *testing.T, e *testenv.Env, cfg agent.Config) *agent.Agent {
	t.Helper()
	ctx := context.Background()
	var tok apitypes.BastionPairToken
	if err := e.Client.Call(ctx, "bastions.pairToken", apitypes.BastionPairTokenIn{Name: "box"}, &tok); err != nil {
		t.Fatalf("pair token: %v", err)
	}
	dir := t.TempDir()
	if _, err := agent.Pair(ctx, dir, e.CP.GatewayAddr, tok.Token, "box"); err != nil {
		t.Fatalf("pair: %v", err)
	}
	cfg.DataDir, cfg.Log = dir, e.Log
	a, err := agent.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		a.Close()
	})
	waitFor(t, "the bastion's tunnel handshake", func() bool { return e.CP.Lanes.Connected(a.ID()) })
	return a
}

// waitFor polls cond until it holds or 20 s pass (a deadline, not a
// sleep to synchronise: each poll is a fresh check).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitForWithin(t, 20*time.Second, what, cond)
}

// waitForWithin is waitFor with its own bound: a promise of the product
// (such as an unpaired tunnel down within 5 s) fails the test when missed.
func waitForWithin(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// grantBastion asks bastions.grant and waits for the bastion to hold it.
func grantBastion(t *testing.T, e *testenv.Env, a *agent.Agent, in apitypes.BastionGrantIn, held func(grant.Policy) bool) apitypes.BastionGrant {
	t.Helper()
	in.BastionID = a.ID()
	var g apitypes.BastionGrant
	if err := e.Client.Call(context.Background(), "bastions.grant", in, &g); err != nil {
		t.Fatalf("grant %+v: %v", in, err)
	}
	waitFor(t, "the bastion to hold the grant", func() bool { return held(a.Policy()) })
	return g
}

// laneRequest sends one HTTP request over conn and reads the answer.
func laneRequest(t *testing.T, conn io.ReadWriter, br *bufio.Reader, method, path, body string) (int, string) {
	t.Helper()
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: ollama\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", method, path, len(body), body)
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatalf("%s %s: write: %v", method, path, err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// viaLane opens a lane with the Go client and makes one request on it.
func viaLane(t *testing.T, c *client.Client, id, method, path, body string) (int, string) {
	t.Helper()
	conn, err := c.ConnectLane(context.Background(), id, "inference/ollama")
	if err != nil {
		t.Fatalf("connect lane: %v", err)
	}
	defer conn.Close()
	return laneRequest(t, conn, bufio.NewReader(conn), method, path, body)
}

// wantRefusal checks an HTTP refusal's status and reason.
func wantRefusal(t *testing.T, what string, status int, body string, wantStatus int, reason string) {
	t.Helper()
	if status != wantStatus || !strings.Contains(body, `"reason":"`+reason+`"`) {
		t.Fatalf("%s: %d %s, want %d with reason %s", what, status, body, wantStatus, reason)
	}
}

// TestBastionForwardEndToEnd pairs a bastion on loopback, brings its
// WireGuard tunnel up, and reaches a fake Ollama through `bastions
// connect`: the model list is rewritten to the granted models, /api/pull
// is refused without `models` and allowed with it, a deny beats an allow,
// and the 17th stream of the pairing is refused busy.
func TestBastionForwardEndToEnd(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := bastionEnv(t, db)
		srv := fakeOllama(t)
		a := pairBastion(t, e, map[forward.Kind]string{forward.KindOllama: srv.Listener.Addr().String()})

		// Before any grant: refused at accept.
		st, body := viaLane(t, e.Client, a.ID(), "GET", "/api/tags", "")
		wantRefusal(t, "no grant", st, body, http.StatusForbidden, "inference-not-granted")

		grantBastion(t, e, a, apitypes.BastionGrantIn{Allow: []string{"inference"}, Models: []string{"llama3:8b", "qwen2:7b"}},
			func(p grant.Policy) bool { return p.Allows("inference") })
		st, body = viaConnectCLI(t, e, a.ID(), "GET", "/api/tags", "")
		if st != http.StatusOK || !strings.Contains(body, "llama3:8b") || !strings.Contains(body, "qwen2:7b") || strings.Contains(body, "secret") {
			t.Fatalf("/api/tags through bastions connect: %d %s, want only the two granted models", st, body)
		}
		st, body = viaLane(t, e.Client, a.ID(), "POST", "/api/generate", `{"model":"secret:70b","prompt":"x"}`)
		wantRefusal(t, "out-of-scope model", st, body, http.StatusForbidden, "model-out-of-scope")
		st, body = viaLane(t, e.Client, a.ID(), "POST", "/api/pull", `{"model":"llama3:8b"}`)
		wantRefusal(t, "pull without models", st, body, http.StatusForbidden, "models-not-granted")

		grantBastion(t, e, a, apitypes.BastionGrantIn{Allow: []string{"models"}, Models: []string{"llama3:8b"}},
			func(p grant.Policy) bool { return p.Allows("models") })
		if st, body = viaLane(t, e.Client, a.ID(), "POST", "/api/pull", `{"model":"llama3:8b"}`); st != http.StatusOK || !strings.Contains(body, "success") {
			t.Fatalf("pull with models: %d %s", st, body)
		}

		deny := grantBastion(t, e, a, apitypes.BastionGrantIn{Allow: []string{"services"}, Deny: []string{"inference"}},
			func(p grant.Policy) bool { return !p.Allows("inference") })
		st, body = viaLane(t, e.Client, a.ID(), "GET", "/api/tags", "")
		wantRefusal(t, "deny beats allow", st, body, http.StatusForbidden, "inference-not-granted")
		if err := e.Client.Call(context.Background(), "bastions.revokeGrant", apitypes.IDIn{ID: deny.ID}, nil); err != nil {
			t.Fatalf("revoke the deny: %v", err)
		}
		waitFor(t, "the deny to be gone", func() bool { return a.Policy().Allows("inference") })

		// The streams of the requests above end as their lanes close.
		waitFor(t, "the earlier streams to end", func() bool { return a.LiveStreams() == 0 })
		holdSixteenThenBusy(t, e, a.ID())
	})
}

// holdSixteenThenBusy holds 16 streams open (each answered once, kept
// alive) and checks the 17th is answered busy, then that closing one
// frees its slot.
func holdSixteenThenBusy(t *testing.T, e *testenv.Env, id string) {
	t.Helper()
	var held []io.ReadWriteCloser
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range agent.MaxStreams {
		conn, err := e.Client.ConnectLane(context.Background(), id, "inference/ollama")
		if err != nil {
			t.Fatalf("stream %d: %v", i+1, err)
		}
		held = append(held, conn)
		if st, body := laneRequest(t, conn, bufio.NewReader(conn), "GET", "/api/version", ""); st != http.StatusOK {
			t.Fatalf("stream %d: %d %s", i+1, st, body)
		}
	}
	st, body := viaLane(t, e.Client, id, "GET", "/api/version", "")
	wantRefusal(t, "the 17th stream", st, body, http.StatusServiceUnavailable, "busy")
	held[0].Close()
	held = held[1:]
	waitFor(t, "a freed stream", func() bool {
		st, _ := viaLane(t, e.Client, id, "GET", "/api/version", "")
		return st == http.StatusOK
	})
}

// viaConnectCLI runs `better-compute bastions connect --listen` and makes
// one request through its listener.
func viaConnectCLI(t *testing.T, e *testenv.Env, id, method, path, body string) (int, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.Client.Key())
	t.Setenv("BC_API_KEY_FILE", "")
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- cli.MainContext(ctx, []string{"bastions", "connect", "--bastion", id, "--lane", "inference/ollama", "--listen", addr}, &out, &errb)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("bastions connect: exit %d: %s", code, errb.String())
		}
	}()
	var conn net.Conn
	waitFor(t, "bastions connect's listener", func() bool {
		conn, err = net.Dial("tcp", addr)
		return err == nil
	})
	defer conn.Close()
	return laneRequest(t, conn, bufio.NewReader(conn), method, path, body)
}

// Another tenant's admin cannot open a lane on the bastion: the answer is
// the one a missing bastion gets.
func TestBastionLaneOtherTenantIsNotFound(t *testing.T) {
	e := bastionEnv(t, storetest.NewTestSQLite(t))
	srv := fakeOllama(t)
	a := pairBastion(t, e, map[forward.Kind]string{forward.KindOllama: srv.Listener.Addr().String()})
	_, other := e.TenantAdmin(t, "lane-other")
	_, err1 := other.ConnectLane(context.Background(), a.ID(), "inference/ollama")
	_, err2 := other.ConnectLane(context.Background(), "nd_missing0000000000", "inference/ollama")
	var e1, e2 *client.Error
	if !errors.As(err1, &e1) || !errors.As(err2, &e2) || e1.Code != e2.Code || e1.Status != e2.Status ||
		strings.ReplaceAll(e1.Message, a.ID(), "ID") != strings.ReplaceAll(e2.Message, "nd_missing0000000000", "ID") {
		t.Fatalf("another tenant's bastion: %v; a missing one: %v; want the same answer", err1, err2)
	}
	if !slices.Contains([]string{"NOT_FOUND", "ACCESS_DENIED"}, e1.Code) {
		t.Fatalf("another tenant's bastion answers %s", e1.Code)
	}
}
