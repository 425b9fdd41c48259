package sandbox

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/netguard"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// RequireEgress returns the host's egress wiring for a test: runc as
// RequireRunc, plus iproute2 and nftables; with BC_REQUIRE_RUNC=1 a
// missing tool fails the test instead of skipping it.
func RequireEgress(t *testing.T) *Egress { return requireEgressTicks(t, nil) }

// requireEgressTicks is RequireEgress with the firewall guard driven by
// ticks (nil: its own ticker).
func requireEgressTicks(t *testing.T, ticks <-chan time.Time) *Egress {
	t.Helper()
	RequireRunc(t)
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("BC_REQUIRE_RUNC") == "1" {
				t.Fatalf("egress needs %s (BC_REQUIRE_RUNC=1)", tool)
			}
			t.Skip("EGRESS TEST NOT RUN: " + tool + " is not installed")
		}
	}
	eg, err := NewEgress(context.Background(), EgressConfig{Log: slog.New(slog.NewTextHandler(testLogOut(io.Discard), nil)), GuardTicks: ticks})
	if err != nil {
		t.Fatalf("egress: %v", err)
	}
	t.Cleanup(eg.Close)
	return eg
}

// countingListener accepts and closes connections on addr, counting them;
// stop closes it and returns the final count.
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
			c.Close()
		}
	}()
	return strconv.Itoa(lis.Addr().(*net.TCPAddr).Port), func() int32 {
		lis.Close()
		<-done
		return n.Load()
	}
}

// TestRuncEgressOnlyThroughProxy runs an egress sandbox and checks from
// inside: the proxy variables are set, there is no default route, the
// host's loopback and any other port of the link's host end are
// unreachable, and the proxy answers but refuses a loopback target with
// its reason. Every target is on this machine. Deleting the sandbox
// removes its link, namespace and proxy listener.
func TestRuncEgressOnlyThroughProxy(t *testing.T) {
	eg := RequireEgress(t)
	h, digest := testHostEgress(t, runcRuntime(t), clock.Real{}, eg)
	if h.Labels()[spec.EgressLabel] != "true" {
		t.Fatalf("labels %v lack %s", h.Labels(), spec.EgressLabel)
	}
	c := createSpec(digest, time.Now().Add(10*time.Minute), 64)
	c.Network = spec.NetworkEgress
	mustCreate(t, h, c)
	st, _ := h.Get(c.SandboxID)
	if st.Link == nil {
		t.Fatal("no link in the state")
	}
	l := *st.Link
	if len(l.HostIf) > 15 {
		t.Fatalf("interface name %q longer than 15", l.HostIf)
	}
	proxy := net.JoinHostPort(l.HostAddr, strconv.Itoa(l.ProxyPort))

	env := string(execIn(t, h, c.SandboxID, 10*time.Second, "env").Stdout)
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		if !strings.Contains(env, k+"=http://"+proxy+"\n") {
			t.Fatalf("env lacks %s=http://%s:\n%s", k, proxy, env)
		}
	}
	routes := string(execIn(t, h, c.SandboxID, 10*time.Second, "cat", "/proc/net/route").Stdout)
	for _, line := range strings.Split(routes, "\n")[1:] {
		if f := strings.Fields(line); len(f) > 2 && f[1] == "00000000" {
			t.Fatalf("the sandbox has a default route:\n%s", routes)
		}
	}

	// The host's loopback is unreachable.
	loPort, loStop := countingListener(t, "127.0.0.1:0")
	if r := execIn(t, h, c.SandboxID, 10*time.Second, "nc", "-w", "2", "127.0.0.1", loPort); r.ExitCode == 0 {
		t.Fatalf("nc to the host's loopback succeeded: %+v", r)
	}
	// A service listening on every host address is unreachable through
	// the link's host end: only the proxy port is.
	anyPort, anyStop := countingListener(t, "0.0.0.0:0")
	if r := execIn(t, h, c.SandboxID, 10*time.Second, "nc", "-w", "2", l.HostAddr, anyPort); r.ExitCode == 0 {
		t.Fatalf("nc to %s:%s succeeded: %+v", l.HostAddr, anyPort, r)
	}

	// The proxy answers, and refuses a loopback target with its reason,
	// for plain HTTP and for CONNECT. The request goes in through a FIFO
	// held open until nc ends, so the client never half-closes (Go's
	// server cancels a request whose client did).
	for req, reason := range map[string]string{
		"GET http://127.0.0.1:" + loPort + "/ HTTP/1.1\r\nHost: 127.0.0.1:" + loPort + "\r\nConnection: close\r\n\r\n": "loopback",
		"CONNECT 127.0.0.1:" + loPort + " HTTP/1.1\r\nHost: 127.0.0.1:" + loPort + "\r\nConnection: close\r\n\r\n":     "loopback",
		"CONNECT localhost:" + loPort + " HTTP/1.1\r\nHost: localhost:" + loPort + "\r\nConnection: close\r\n\r\n":     "localhost-name",
		"CONNECT " + proxy + " HTTP/1.1\r\nHost: " + proxy + "\r\nConnection: close\r\n\r\n":                           "private",
	} {
		r := execIn(t, h, c.SandboxID, 15*time.Second, "sh", "-c", `f=$(mktemp -u) && mkfifo "$f" && { nc -w 5 "$2" "$3" <"$f" & exec 3>"$f"; printf '%s' "$1" >&3; wait $!; }`, "sh", req, l.HostAddr, strconv.Itoa(l.ProxyPort))
		out := string(r.Stdout)
		if !strings.HasPrefix(out, "HTTP/1.1 403 ") || !strings.HasSuffix(out, "\r\n\r\nrefused: "+reason+"\n") {
			t.Fatalf("proxy answer to %q: %q (stderr %q), want 403 refused: %s", strings.SplitN(req, "\r\n", 2)[0], out, r.Stderr, reason)
		}
	}
	if n := loStop(); n != 0 {
		t.Fatalf("the host's loopback listener accepted %d connections", n)
	}
	if n := anyStop(); n != 0 {
		t.Fatalf("the wildcard listener accepted %d connections from the sandbox", n)
	}

	raw, _ := json.Marshal(spec.Delete{SandboxID: c.SandboxID})
	if _, err := h.Delete(context.Background(), raw); err != nil {
		t.Fatal(err)
	}
	assertGone(t, h, c.SandboxID)
	if _, err := os.Stat("/sys/class/net/" + l.HostIf); !os.IsNotExist(err) {
		t.Fatalf("host interface %s survived the delete: %v", l.HostIf, err)
	}
	if _, err := os.Stat(l.NetNSPath()); !os.IsNotExist(err) {
		t.Fatalf("netns %s survived the delete: %v", l.NetNS, err)
	}
	// No dial here: with the link gone, the address would route off this
	// machine. The listener is gone from the host's table and the
	// address from every interface.
	eg.mu.Lock()
	_, serving := eg.serve[c.SandboxID]
	eg.mu.Unlock()
	if serving {
		t.Fatal("the proxy listener survived the delete")
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if strings.HasPrefix(a.String(), l.HostAddr+"/") {
			t.Fatalf("%s is still an address of this machine", l.HostAddr)
		}
	}
}

// TestEgressPlanDistinctLinks plans links for many sandboxes: each gets
// its own /30 (host end .1, sandbox end .2 of it), an interface name of
// at most 15 bytes, and a slot already taken is never reused.
func TestEgressPlanDistinctLinks(t *testing.T) {
	e := &Egress{cfg: EgressConfig{Port: DefaultEgressPort}}
	e.cfg.Range = mustPrefix(t, "10.253.0.0/28") // 4 slots
	taken := map[int]bool{}
	for range 4 {
		id := ids.New("sbx")
		l, err := e.Plan(id, taken)
		if err != nil {
			t.Fatal(err)
		}
		if taken[l.Slot] || len(l.HostIf) > 15 || !strings.HasPrefix(l.HostIf, EgressIfPrefix) || l.NetNS != "bc-"+id {
			t.Fatalf("link %+v (taken %v)", l, taken)
		}
		base := 10<<24 | 253<<16 | l.Slot*4
		if l.HostAddr != ipv4(base+1) || l.SandboxAddr != ipv4(base+2) {
			t.Fatalf("link %+v: addresses not the slot's .1 and .2", l)
		}
		taken[l.Slot] = true
	}
	if _, err := e.Plan(ids.New("sbx"), taken); err == nil {
		t.Fatal("a full range planned another link")
	}
}

func ipv4(n int) string {
	return net.IPv4(byte(n>>24), byte(n>>16), byte(n>>8), byte(n)).String()
}

func mustPrefix(t *testing.T, s string) netip.Prefix {
	t.Helper()
	p, err := netip.ParsePrefix(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestProxyConnBudgetLeavesDaemonHalf: the egress proxy's connection cap
// (two descriptors each) is at most half of the process's descriptors,
// and never more than netguard's overall default.
func TestProxyConnBudgetLeavesDaemonHalf(t *testing.T) {
	for _, nofile := range []uint64{256, 1024, 4096, 20000, 1 << 20} {
		b := ProxyConnBudget(nofile)
		if b < 1 || uint64(2*b) > nofile/2 || b > netguard.DefaultMaxConns {
			t.Fatalf("nofile %d: budget %d", nofile, b)
		}
	}
}

// TestRuncEgressFirewallGuard flushes the egress firewall table under a
// running egress sandbox: at the guard's next check the table is loaded
// again. Then, with nft failing (a stand-in binary that exits 1), a
// flushed table cannot be restored: egress fails closed (the link's host
// end is down and the sandbox cannot reach the proxy) until nft works
// again and the next check restores the table and the link.
func TestRuncEgressFirewallGuard(t *testing.T) {
	ticks := make(chan time.Time)
	eg := requireEgressTicks(t, ticks)
	h, digest := testHostEgress(t, runcRuntime(t), clock.Real{}, eg)
	c := createSpec(digest, time.Now().Add(10*time.Minute), 64)
	c.Network = spec.NetworkEgress
	mustCreate(t, h, c)
	st, _ := h.Get(c.SandboxID)
	l := *st.Link
	reach := func() bool {
		r := execIn(t, h, c.SandboxID, 15*time.Second, "sh", "-c", "nc -w 2 "+l.HostAddr+" "+strconv.Itoa(l.ProxyPort)+" </dev/null")
		return r.ExitCode == 0
	}
	if !reach() {
		t.Fatal("the sandbox cannot reach its proxy to begin with")
	}
	intact := func() bool {
		e := eg
		e.mu.Lock()
		want := e.want
		e.mu.Unlock()
		got, err := e.listFirewall(context.Background(), "nft")
		return err == nil && got == want
	}
	flush := func() {
		if out, err := exec.Command("nft", "flush", "table", "inet", egressTable).CombinedOutput(); err != nil {
			t.Fatalf("nft flush: %v %s", err, out)
		}
		if intact() {
			t.Fatal("the flush changed nothing")
		}
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("never: %s", what)
			}
			select {
			case ticks <- time.Now():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	operstate := func() string {
		b, _ := os.ReadFile("/sys/class/net/" + l.HostIf + "/operstate")
		return strings.TrimSpace(string(b))
	}

	flush()
	waitFor("the guard restores the flushed table", intact)

	failing := filepath.Join(t.TempDir(), "nft")
	if err := os.WriteFile(failing, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	eg.mu.Lock()
	eg.nft = failing
	eg.mu.Unlock()
	flush()
	waitFor("egress stops while the table cannot be restored", func() bool { return eg.Stopped() && operstate() == "down" })
	if reach() {
		t.Fatal("the sandbox reaches its proxy while the firewall is gone")
	}
	eg.mu.Lock()
	eg.nft = "nft"
	eg.mu.Unlock()
	waitFor("egress resumes once the table is back", func() bool { return !eg.Stopped() && intact() && operstate() != "down" })
	waitFor("the sandbox reaches its proxy again", reach)
}
