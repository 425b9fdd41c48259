package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/bastion/agent"
	"github.com/bettercompute/bettercompute/internal/bastion/forward"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// The bench's two answers: a small generate answer for latency, and a
// 1 MiB one for throughput, chosen by the model the request names.
const (
	benchSmallModel = "m:latest"
	benchBigModel   = "big:latest"
	benchBigSize    = 1 << 20
)

// benchSmallBody is the fixed answer to a generate of benchSmallModel.
var benchSmallBody = []byte(`{"model":"m:latest","response":"hi","done":true}`)

// benchModelServer is a fake Ollama on loopback whose /api/generate
// answers benchSmallBody for benchSmallModel and a 1 MiB JSON body for
// benchBigModel (any other model: 404, so a mix-up fails the bench).
func benchModelServer(tb testing.TB) *httptest.Server {
	tb.Helper()
	big := make([]byte, benchBigSize)
	head := []byte(`{"model":"big:latest","response":"`)
	copy(big, head)
	for i := len(head); i < len(big)-2; i++ {
		big[i] = 'x'
	}
	copy(big[len(big)-2:], `"}`)
	mux := http.NewServeMux()
	mux.HandleFunc("/api/generate", func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Model string }
		_ = json.NewDecoder(r.Body).Decode(&in)
		body := benchSmallBody
		switch in.Model {
		case benchSmallModel:
		case benchBigModel:
			body = big
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	})
	srv := httptest.NewServer(mux)
	tb.Cleanup(srv.Close)
	return srv
}

// bastionEnvTB is bastionEnv for benchmarks: a control plane with the
// lanes role on loopback.
func bastionEnvTB(tb testing.TB, db *store.DB) *testenv.Env {
	tb.Helper()
	return testenv.Start(tb, db, testenv.Options{Tune: func(o *server.Options) {
		o.Roles = []string{server.RoleAPI, server.RoleGateway, server.RoleWorkers, server.RoleLanes}
		o.LanesListen = "127.0.0.1:0"
	}})
}

// waitForTB is waitFor for benchmarks: it polls cond until it holds or
// 20 s pass (a deadline, not a sleep to synchronise).
func waitForTB(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pairBastionTB is pairBastion for benchmarks: it pairs a bastion with
// forwards, runs it until the benchmark ends, and returns once its tunnel
// had its first handshake.
func pairBastionTB(tb testing.TB, e *testenv.Env, forwards map[forward.Kind]string) *agent.Agent {
	tb.Helper()
	ctx := context.Background()
	var tok apitypes.BastionPairToken
	if err := e.Client.Call(ctx, "bastions.pairToken", apitypes.BastionPairTokenIn{Name: "box"}, &tok); err != nil {
		tb.Fatalf("pair token: %v", err)
	}
	dir := tb.TempDir()
	if _, err := agent.Pair(ctx, dir, e.CP.GatewayAddr, tok.Token, "box"); err != nil {
		tb.Fatalf("pair: %v", err)
	}
	a, err := agent.Open(ctx, agent.Config{DataDir: dir, Forwards: forwards, Log: e.Log})
	if err != nil {
		tb.Fatalf("open: %v", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(rctx) }()
	tb.Cleanup(func() {
		cancel()
		<-done
		a.Close()
	})
	waitForTB(tb, "the bastion's tunnel handshake", func() bool { return e.CP.Lanes.Connected(a.ID()) })
	return a
}

// benchPath is one way from the client to the fake model server.
type benchPath struct {
	name string
	dial func(tb testing.TB) io.ReadWriteCloser
}

// bastionBench is the benchmark's one environment: a control plane with
// the lanes role, a paired bastion granted inference on both bench models,
// and the three paths to the same model server.
type bastionBench struct {
	agent *agent.Agent
	paths []benchPath
}

// newBastionBench starts the environment. The paths are "direct"
// (loopback TCP to the server), "tunnel" (lanes.Role.Connect: the
// user-space WireGuard tunnel to the bastion's gated listener, its filter,
// then the server) and "forward" (client.ConnectLane: the API's lane
// endpoint, then the tunnel path).
func newBastionBench(tb testing.TB) *bastionBench {
	tb.Helper()
	e := bastionEnvTB(tb, storetest.NewTestSQLite(tb))
	srv := benchModelServer(tb)
	a := pairBastionTB(tb, e, map[forward.Kind]string{forward.KindOllama: srv.Listener.Addr().String()})
	in := apitypes.BastionGrantIn{BastionID: a.ID(), Allow: []string{"inference"}, Models: []string{benchSmallModel, benchBigModel}}
	if err := e.Client.Call(context.Background(), "bastions.grant", in, &apitypes.BastionGrant{}); err != nil {
		tb.Fatalf("grant: %v", err)
	}
	waitForTB(tb, "the bastion to hold the grant", func() bool {
		p := a.Policy()
		return p.ModelInScope(benchSmallModel) && p.ModelInScope(benchBigModel)
	})
	paths := []benchPath{
		{"direct", func(tb testing.TB) io.ReadWriteCloser {
			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				tb.Fatalf("dial the server: %v", err)
			}
			return c
		}},
		{"tunnel", func(tb testing.TB) io.ReadWriteCloser {
			c, err := e.CP.Lanes.Connect(context.Background(), a.ID(), "inference/ollama")
			if err != nil {
				tb.Fatalf("lanes connect: %v", err)
			}
			return c
		}},
		{"forward", func(tb testing.TB) io.ReadWriteCloser {
			c, err := e.Client.ConnectLane(context.Background(), a.ID(), "inference/ollama")
			if err != nil {
				tb.Fatalf("connect lane: %v", err)
			}
			return c
		}},
	}
	return &bastionBench{agent: a, paths: paths}
}

// benchRequest is the raw HTTP/1.1 generate request for model (kept
// alive: no Connection: close).
func benchRequest(model string) []byte {
	body := fmt.Sprintf(`{"model":%q,"prompt":"x","stream":false}`, model)
	return fmt.Appendf(nil, "POST /api/generate HTTP/1.1\r\nHost: ollama\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// benchRoundTrip sends req on conn and reads the whole answer; it fails
// unless the answer is 200 with exactly want bytes, so a refusal (a
// short JSON error) is never measured as a fast answer.
func benchRoundTrip(tb testing.TB, conn io.Writer, br *bufio.Reader, req []byte, want int) {
	if _, err := conn.Write(req); err != nil {
		tb.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		tb.Fatalf("read: %v", err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || n != int64(want) {
		tb.Fatalf("answer: %s, %d bytes (%v); want 200 OK with %d bytes", resp.Status, n, err, want)
	}
}

// BenchmarkBastionForward measures, in one process and against the same
// fake model server, one keep-alive HTTP request/response by three paths:
// "direct" (loopback TCP to the server), "tunnel" (the lanes role's
// user-space WireGuard tunnel to the bastion's gated listener and its
// filter) and "forward" (the whole path: the API's lane endpoint, then
// the tunnel). "latency" is a small generate answer; "throughput-1MiB" a
// 1 MiB one (MB/s from b.SetBytes). The tunnel and forward results report
// x-direct: their ns/op over the median ns/op of the direct runs before
// them in this process (run with -count N for N of each). Run it with
// bench/bastion/run.
func BenchmarkBastionForward(b *testing.B) {
	env := newBastionBench(b)
	cases := []struct {
		name, model string
		size        int
		setBytes    bool
	}{
		{"latency", benchSmallModel, len(benchSmallBody), false},
		{"throughput-1MiB", benchBigModel, benchBigSize, true},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			req := benchRequest(c.model)
			var direct []float64
			for _, p := range env.paths {
				b.Run(p.name, func(b *testing.B) {
					ns := env.measure(b, p, req, c.size, c.setBytes)
					if p.name == "direct" {
						direct = append(direct, ns)
					} else if len(direct) > 0 {
						b.ReportMetric(ns/median(direct), "x-direct")
					}
				})
			}
		})
	}
}

// measure runs b's loop over one connection of path p (opened and warmed
// by one request outside the timer) and returns the measured ns per
// request. It waits for the bastion to free the stream before returning,
// so runs never meet the pairing's stream cap.
func (env *bastionBench) measure(b *testing.B, p benchPath, req []byte, size int, setBytes bool) float64 {
	conn := p.dial(b)
	br := bufio.NewReaderSize(conn, 64<<10)
	benchRoundTrip(b, conn, br, req, size)
	if setBytes {
		b.SetBytes(int64(size))
	}
	for b.Loop() {
		benchRoundTrip(b, conn, br, req, size)
	}
	ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	conn.Close()
	waitForTB(b, "the stream to end", func() bool { return env.agent.LiveStreams() == 0 })
	return ns
}

// median is the median of xs (xs is not empty).
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// TestBastionBenchPaths runs each of BenchmarkBastionForward's paths once
// for each answer size, so the suite notices when the benchmark's set-up
// or requests stop passing the forward's filter (no timing is checked).
func TestBastionBenchPaths(t *testing.T) {
	env := newBastionBench(t)
	for _, p := range env.paths {
		conn := p.dial(t)
		br := bufio.NewReader(conn)
		benchRoundTrip(t, conn, br, benchRequest(benchSmallModel), len(benchSmallBody))
		benchRoundTrip(t, conn, br, benchRequest(benchBigModel), benchBigSize)
		conn.Close()
	}
	// A model outside the grant is refused by the forward, and the bench's
	// check does not take the refusal for an answer.
	conn := env.paths[2].dial(t)
	defer conn.Close()
	if _, err := conn.Write(benchRequest("other:latest")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !bytes.Contains(body, []byte(`"reason":"model-out-of-scope"`)) {
		t.Fatalf("out-of-scope model through the forward: %s %s, want 403 model-out-of-scope", resp.Status, body)
	}
}
