package action

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// countingListener accepts connections on addr, counting them, answers
// each with an empty HTTP 200 (so a wget that got through succeeds) and
// closes it; stop closes it and returns the count.
func countingListener(t *testing.T, addr string) (port string, stop func() int32) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_, _ = c.Write([]byte("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"))
			c.Close()
		}
	}()
	return strconv.Itoa(lis.Addr().(*net.TCPAddr).Port), func() int32 {
		lis.Close()
		<-done
		return n.Load()
	}
}

// hostAddr returns a non-loopback IPv4 address of this machine.
func hostAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	t.Fatal("no non-loopback IPv4 address on this machine")
	return ""
}

// TestDryRunCannotReachNetwork: listeners on the host's loopback and on
// its own network address see no connection from a dry run's wget or nc,
// and the program's output says each attempt failed.
func TestDryRunCannotReachNetwork(t *testing.T) {
	for _, rt := range []string{RuntimeRunc, RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			requireRuntime(t, rt)
			testNoNetwork(t, rt)
		})
	}
}

func testNoNetwork(t *testing.T, rt string) {
	e := newEnv(t, testOpts{runtime: rt})
	targets := []string{"127.0.0.1", hostAddr(t)}
	var script strings.Builder
	var stops []func() int32
	for _, ip := range targets {
		port, stop := countingListener(t, net.JoinHostPort(ip, "0"))
		stops = append(stops, stop)
		fmt.Fprintf(&script, "if wget -q -T 2 -O /dev/null http://%s:%s/; then echo REACHED wget %s; else echo FAILED wget %s; fi\n", ip, port, ip, ip)
		fmt.Fprintf(&script, "if echo hi | nc -w 2 %s %s; then echo REACHED nc %s; else echo FAILED nc %s; fi\n", ip, port, ip, ip)
	}
	script.WriteString("ls /sys/class/net > out.txt\n")
	plan, err := e.r.DryRun(context.Background(), e.folder, Program{Script: script.String(), Effects: []string{"out.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, stop := range stops {
		if n := stop(); n != 0 {
			t.Errorf("the listener on %s saw %d connections", targets[i], n)
		}
	}
	if strings.Contains(plan.Stdout, "REACHED") {
		t.Fatalf("the dry run reached the network:\n%s", plan.Stdout)
	}
	for _, ip := range targets {
		for _, tool := range []string{"wget", "nc"} {
			if !strings.Contains(plan.Stdout, "FAILED "+tool+" "+ip) {
				t.Fatalf("no failure of %s %s in:\n%s", tool, ip, plan.Stdout)
			}
		}
	}
	if rt == RuntimeRunc {
		// Only loopback in the container's network namespace.
		if len(plan.Changes) != 1 || plan.Changes[0].SHA256 != sha256Hex([]byte("lo\n")) {
			t.Fatalf("interfaces changed the plan: %+v", plan.Changes)
		}
	}
}

// inputServer serves body at every path.
func inputServer(t *testing.T, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, body) }))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// TestInputHostCheckedAgainAtApply: a name that resolved to a public
// address at the dry run (its input fetched and mounted at /inputs) but
// resolves to a private one at apply is refused, and nothing lands.
func TestInputHostCheckedAgainAtApply(t *testing.T) {
	requireRunc(t)
	e := newEnv(t, testOpts{dialTo: inputServer(t, "fetched body\n")})
	e.res.set("files.example.com", "93.184.216.34")
	p := Program{Script: "cat /inputs/data > out.txt", Effects: []string{"out.txt"},
		Inputs: []Input{{URL: "http://files.example.com/data.txt", As: "data"}}}
	plan, err := e.r.DryRun(context.Background(), e.folder, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Changes) != 1 || plan.Changes[0].SHA256 != sha256Hex([]byte("fetched body\n")) {
		t.Fatalf("plan %+v", plan)
	}
	if len(e.dialled) != 1 || e.dialled[0] != "93.184.216.34:80" {
		t.Fatalf("dialled %v, want only the checked address", e.dialled)
	}
	e.res.set("files.example.com", "93.184.216.34", "10.0.0.5")
	_, err = e.r.Apply(context.Background(), e.folder, plan.ID, plan.Digest)
	wantReason(t, err, ReasonDestinationPrivate)
	if got := e.read(t, "out.txt"); got != "<absent>" {
		t.Fatalf("out.txt %q", got)
	}
}

// TestFetchRefusesPrivateName: a name that resolves to a private address
// (any of its addresses) is refused at the dry run and never dialled; an
// anchored machine fetches from it.
func TestFetchRefusesPrivateName(t *testing.T) {
	requireRunc(t)
	e := newEnv(t, testOpts{dialTo: inputServer(t, "lan\n")})
	e.res.set("nas.example.com", "93.184.216.34", "10.0.0.5")
	p := Program{Script: "cat /inputs/x > out.txt", Effects: []string{"out.txt"}, Inputs: []Input{{URL: "http://nas.example.com/x", As: "x"}}}
	_, err := e.r.DryRun(context.Background(), e.folder, p)
	wantReason(t, err, ReasonDestinationPrivate)
	if len(e.dialled) != 0 {
		t.Fatalf("dialled %v", e.dialled)
	}
	e.anchored = true
	plan, err := e.r.DryRun(context.Background(), e.folder, p)
	if err != nil || len(plan.Changes) != 1 {
		t.Fatalf("anchored: %+v %v", plan, err)
	}
}

// TestFetchRefusesLargeInput: an input over MaxInputBytes is refused.
func TestFetchRefusesLargeInput(t *testing.T) {
	requireRunc(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		chunk := make([]byte, 1<<20)
		for range MaxInputBytes>>20 + 1 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	e := newEnv(t, testOpts{dialTo: srv.Listener.Addr().String()})
	e.res.set("big.example.com", "93.184.216.34")
	p := Program{Script: "true", Effects: []string{"out.txt"}, Inputs: []Input{{URL: "http://big.example.com/", As: "big"}}}
	_, err := e.r.DryRun(context.Background(), e.folder, p)
	wantReason(t, err, ReasonInputTooLarge)
}

// TestDryRunTimeout: a program past the timeout is stopped, the plan says
// so, and the container is gone.
func TestDryRunTimeout(t *testing.T) {
	runc := requireRunc(t)
	e := newEnv(t, testOpts{timeout: time.Second})
	start := time.Now()
	plan, err := e.r.DryRun(context.Background(), e.folder, Program{Script: "echo started; sleep 60", Effects: []string{"out.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 20*time.Second || plan.ExitCode == 0 || !strings.Contains(plan.Stderr, "stopped after 1s") {
		t.Fatalf("took %v, plan %+v", time.Since(start), plan)
	}
	out, err := execOutput(runc, e.r.runtimeArgs("list", "-q")...)
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("containers left: %q %v", out, err)
	}
}
