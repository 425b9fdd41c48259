package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// benchClientEnv set to "1" makes the test binary a benchmark client
// (runBenchClient) instead of running tests. The sandbox benchmark times
// API calls from this other process, as a caller makes them: in the
// benchmark's own process the answer would be read by a goroutine that
// shares the Go scheduler with the control plane's background work (the
// signer, the gateway and the host, woken by the call being timed).
const benchClientEnv = "BC_BENCH_CLIENT"

// benchHello is the client's first input line: where the API is and the
// key to call it with (on standard input, never in argv or the
// environment).
type benchHello struct {
	BaseURL string `json:"base_url"`
	Key     string `json:"key"`
}

// benchOp is one request to the client: "claim" makes N sandboxes.create
// of Template, each timed and, with Wait, followed by an untimed exec of
// `true` (which waits for the host to apply the claim); "noop" makes N
// identities.whoami, each after an untimed exec of `true` in sandbox
// AfterExec when it is set (the position of a claim made alone), or after
// a pause of Pause milliseconds (a call to an idle machine).
type benchOp struct {
	Op        string `json:"op"`
	N         int    `json:"n"`
	Template  string `json:"template,omitempty"`
	Wait      bool   `json:"wait,omitempty"`
	AfterExec string `json:"after_exec,omitempty"`
	Pause     int    `json:"pause,omitempty"`
}

// benchResult is the client's answer to one op: the durations in
// microseconds, the sandboxes made, or the error that stopped it.
type benchResult struct {
	Micros []int64  `json:"micros"`
	IDs    []string `json:"ids,omitempty"`
	Error  string   `json:"error,omitempty"`
}

// runBenchClient serves ops read from in until it ends, one result line
// each on out.
func runBenchClient(in io.Reader, out io.Writer) int {
	sc := bufio.NewScanner(in)
	var hello benchHello
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &hello) != nil {
		fmt.Fprintln(os.Stderr, "bench client: no hello")
		return 2
	}
	c := client.New(hello.BaseURL, hello.Key)
	enc := json.NewEncoder(out)
	for sc.Scan() {
		var op benchOp
		if err := json.Unmarshal(sc.Bytes(), &op); err != nil {
			fmt.Fprintln(os.Stderr, "bench client: bad op")
			return 2
		}
		if err := enc.Encode(benchRun(c, op)); err != nil {
			return 1
		}
	}
	return 0
}

// benchRun runs one op.
func benchRun(c *client.Client, op benchOp) benchResult {
	ctx := context.Background()
	var r benchResult
	for i := 0; i < op.N; i++ {
		t0 := time.Now()
		switch op.Op {
		case "claim":
			x, err := c.CreateSandbox(ctx, "", op.Template)
			if err != nil {
				r.Error = err.Error()
				return r
			}
			r.Micros = append(r.Micros, time.Since(t0).Microseconds())
			if !x.FromWarm {
				r.Error = fmt.Sprintf("create %d was not served from the warm pool", i)
				return r
			}
			r.IDs = append(r.IDs, x.ID)
			if op.Wait {
				if _, err := c.Exec(ctx, x.ID, []string{"true"}, 10); err != nil {
					r.Error = err.Error()
					return r
				}
			}
		case "noop":
			if op.AfterExec != "" {
				if _, err := c.Exec(ctx, op.AfterExec, []string{"true"}, 10); err != nil {
					r.Error = err.Error()
					return r
				}
			}
			if op.Pause > 0 {
				time.Sleep(time.Duration(op.Pause) * time.Millisecond)
			}
			t0 = time.Now()
			if err := c.Call(ctx, "identities.whoami", struct{}{}, nil); err != nil {
				r.Error = err.Error()
				return r
			}
			r.Micros = append(r.Micros, time.Since(t0).Microseconds())
		default:
			r.Error = "unknown op " + op.Op
			return r
		}
	}
	return r
}

// benchClient is a running benchmark client process.
type benchClient struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// startBenchClient starts this test binary as a benchmark client of the
// API at baseURL with key; it is stopped at cleanup.
func startBenchClient(b *testing.B, baseURL, key string) *benchClient {
	b.Helper()
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), benchClientEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	bc := &benchClient{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	b.Cleanup(func() { in.Close(); _ = cmd.Wait() })
	hello, _ := json.Marshal(benchHello{BaseURL: baseURL, Key: key})
	if _, err := fmt.Fprintf(in, "%s\n", hello); err != nil {
		b.Fatal(err)
	}
	return bc
}

// do runs op in the client and returns its durations and sandboxes.
func (bc *benchClient) do(b *testing.B, op benchOp) ([]time.Duration, []string) {
	b.Helper()
	line, _ := json.Marshal(op)
	if _, err := fmt.Fprintf(bc.in, "%s\n", line); err != nil {
		b.Fatal(err)
	}
	if !bc.out.Scan() {
		b.Fatalf("bench client: no answer to %s", op.Op)
	}
	var r benchResult
	if err := json.Unmarshal(bc.out.Bytes(), &r); err != nil {
		b.Fatal(err)
	}
	if r.Error != "" {
		b.Fatalf("bench client: %s: %s", op.Op, r.Error)
	}
	d := make([]time.Duration, len(r.Micros))
	for i, us := range r.Micros {
		d[i] = time.Duration(us) * time.Microsecond
	}
	return d, r.IDs
}

// benchTenantAdmin is testenv's TenantAdmin that also returns the key, for
// a benchmark client.
func benchTenantAdmin(b *testing.B, e *testenv.Env, name string) (tenant, key string, admin *client.Client) {
	b.Helper()
	ctx := context.Background()
	tn, err := e.Client.CreateTenant(ctx, "", name)
	if err != nil {
		b.Fatal(err)
	}
	id, err := e.Client.CreateIdentity(ctx, tn.ID, name+"-admin", "person")
	if err != nil {
		b.Fatal(err)
	}
	if err := e.Client.Bind(ctx, tn.ID, id.ID, "admin"); err != nil {
		b.Fatal(err)
	}
	k, err := e.Client.CreateAPIKey(ctx, tn.ID, id.ID, name, 0)
	if err != nil {
		b.Fatal(err)
	}
	return tn.ID, k.Key, e.NewClient(b, k.Key)
}
