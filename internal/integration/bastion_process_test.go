package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/bastion/agent"
	"github.com/bettercompute/bettercompute/internal/bastion/forward"
	"github.com/bettercompute/bettercompute/internal/bastion/grant"
	"github.com/bettercompute/bettercompute/internal/bastion/sockets"
	"github.com/bettercompute/bettercompute/internal/netguard"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// wantLaneRefused checks that opening lane is refused with code and a
// message naming reason.
func wantLaneRefused(t *testing.T, c *client.Client, id, lane, code, reason string) {
	t.Helper()
	conn, err := c.ConnectLane(context.Background(), id, lane)
	if err == nil {
		conn.Close()
		t.Fatalf("%s: opened, want %s (%s)", lane, code, reason)
	}
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Code != code || !strings.Contains(ae.Message, "("+reason+")") {
		t.Fatalf("%s: %v, want %s (%s)", lane, err, code, reason)
	}
}

// thisMachine is a non-loopback address of one of this machine's
// interfaces ("" when it has none).
func thisMachine() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() {
			return p.Addr().String()
		}
	}
	return ""
}

// TestBastionEgressLaneRefusesLocalTargets: with the egress family, the
// egress lane's targets are judged on the bastion by the egress guard's
// rules: loopback, this machine's own address, private (LAN) and
// link-local (metadata) addresses and a name resolving to loopback are
// each refused with their reason; without the family every target is
// refused egress-not-granted, and on a bastion whose owner did not turn
// egress on (bcd bastion run without --egress) every target is refused
// egress-not-enabled, the grant notwithstanding. Each refusal reaches the
// control plane's audit log in the bastion's tenant.
func TestBastionEgressLaneRefusesLocalTargets(t *testing.T) {
	e := bastionEnv(t, storetest.NewTestSQLite(t))
	off := pairBastion(t, e, nil)
	grantBastion(t, e, off, apitypes.BastionGrantIn{Allow: []string{"egress"}}, func(p grant.Policy) bool { return p.Allows("egress") })
	waitFor(t, "parked egress workers", func() bool { return e.CP.Lanes.EgressParked(off.ID()) > 0 })
	wantLaneRefused(t, e.Client, off.ID(), "egress/93.184.216.34:443", "ACCESS_DENIED", "egress-not-enabled")

	a := pairBastionWith(t, e, agent.Config{EgressEnabled: true})
	waitFor(t, "parked egress workers", func() bool { return e.CP.Lanes.EgressParked(a.ID()) > 0 })
	wantLaneRefused(t, e.Client, a.ID(), "egress/93.184.216.34:443", "ACCESS_DENIED", "egress-not-granted")

	grantBastion(t, e, a, apitypes.BastionGrantIn{Allow: []string{"egress"}}, func(p grant.Policy) bool { return p.Allows("egress") })
	cases := []struct{ target, reason string }{
		{"127.0.0.1:22", "loopback"},
		{"10.0.0.1:80", "private"},
		{"192.168.1.10:80", "private"},
		{"169.254.169.254:80", "link-local"},
		{"localhost:22", "localhost-name"},
		{"[::ffff:10.0.0.1]:80", "private"},
	}
	if own := thisMachine(); own != "" {
		// This machine's own address: this-machine, unless its range is
		// refused first (a private or documentation address).
		reason := string(netguard.Classify(netip.MustParseAddr(own)))
		if reason == "" {
			reason = "this-machine"
		}
		cases = append(cases, struct{ target, reason string }{own + ":22", reason})
	}
	for _, c := range cases {
		waitFor(t, "a parked egress worker", func() bool { return e.CP.Lanes.EgressParked(a.ID()) > 0 })
		conn, err := e.Client.ConnectLane(context.Background(), a.ID(), "egress/"+c.target)
		if err == nil {
			conn.Close()
			t.Fatalf("egress to %s was opened", c.target)
		}
		var ae *client.Error
		if !errors.As(err, &ae) || ae.Code != "ACCESS_DENIED" || !strings.Contains(ae.Message, "("+c.reason+")") {
			t.Fatalf("egress to %s: %v, want ACCESS_DENIED (%s)", c.target, err, c.reason)
		}
	}
	// The bastion's refusals are in the control plane's audit log.
	waitFor(t, "the bastion's refusals in the audit log", func() bool {
		l, err := e.Client.AuditList(context.Background(), "", 0, 0)
		if err != nil {
			return false
		}
		n := 0
		for _, ev := range l.Events {
			if ev.Action == "compute:bastions:lane.refuse" && ev.Outcome == "refused" && strings.Contains(ev.Details, "egress") {
				n++
			}
		}
		return n >= len(cases)+1
	})
}

// TestBastionProcessListensOnlyItsTunnelPort runs `bcd bastion pair` and
// `bcd bastion run` as their own process, reaches a forward through it,
// then lists the process's sockets: one UDP port (the tunnel's) on
// non-loopback addresses, and no TCP listener at all. Then `bcd bastion
// audit verify` checks the on-machine chain, and an unpair takes the
// tunnel down, ends the process with status 3 and deletes its keys. Run
// without --egress, the process refuses the granted egress lane
// (egress-not-enabled).
func TestBastionProcessListensOnlyItsTunnelPort(t *testing.T) {
	e := bastionEnv(t, storetest.NewTestSQLite(t))
	bcd := builtBcd(t)
	srv := fakeOllama(t)
	var tok apitypes.BastionPairToken
	if err := e.Client.Call(context.Background(), "bastions.pairToken", apitypes.BastionPairTokenIn{Name: "proc"}, &tok); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pair := exec.Command(bcd, "bastion", "pair", "--gateway", e.CP.GatewayAddr, "--data", dir, "--name", "proc")
	pair.Env = append(os.Environ(), "BCD_PAIR_TOKEN="+tok.Token)
	out, err := pair.CombinedOutput()
	if err != nil {
		t.Fatalf("bcd bastion pair: %v\n%s", err, out)
	}
	fields := strings.Fields(string(out))
	if len(fields) < 4 {
		t.Fatalf("bcd bastion pair said %q", out)
	}
	id := strings.TrimSuffix(fields[3], ";")
	if strings.Contains(string(out), tok.Token) {
		t.Fatal("bcd bastion pair printed the token")
	}
	run := exec.Command(bcd, "bastion", "run", "--data", dir)
	run.Env = append(os.Environ(), "OLLAMA_ADDR="+srv.Listener.Addr().String(), "BC_LLM_ADDR=127.0.0.1:1", "BC_PII_ADDR=127.0.0.1:1")
	var stderr bytes.Buffer
	run.Stderr = &stderr
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = run.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = run.Process.Kill()
		<-exited
	})
	waitFor(t, "the bastion process's tunnel", func() bool { return e.CP.Lanes.Connected(id) })

	checkOnlyTunnelPort(t, run.Process.Pid)
	grantBastion2(t, e, id)
	conn, err := e.Client.ConnectLane(context.Background(), id, "inference/ollama")
	if err != nil {
		t.Fatal(err)
	}
	if st, body := laneRequest(t, conn, bufio.NewReader(conn), "GET", "/api/tags", ""); st != 200 || !strings.Contains(body, "llama3:8b") || strings.Contains(body, "secret") {
		t.Fatalf("/api/tags through the bastion process: %d %s", st, body)
	}
	conn.Close()
	checkOnlyTunnelPort(t, run.Process.Pid)
	// Run without --egress: the egress lane, granted, is refused on the
	// machine for want of its owner's consent.
	waitFor(t, "parked egress workers", func() bool { return e.CP.Lanes.EgressParked(id) > 0 })
	wantLaneRefused(t, e.Client, id, "egress/93.184.216.34:443", "ACCESS_DENIED", "egress-not-enabled")

	if out, err := exec.Command(bcd, "bastion", "audit", "verify", "--data", dir).CombinedOutput(); err != nil || !strings.Contains(string(out), "chain intact") {
		t.Fatalf("bcd bastion audit verify: %v\n%s", err, out)
	}
	unpairAndWait(t, e, id, dir, exited, &stderr)
	var ee *exec.ExitError
	if !errors.As(waitErr, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("bcd bastion run after unpair: %v, want exit 3\n%s", waitErr, stderr.String())
	}
}

// grantBastion2 grants inference for llama3:8b, and egress, to bastion id and waits
// until a lane answers with it.
func grantBastion2(t *testing.T, e *testenv.Env, id string) {
	t.Helper()
	var g apitypes.BastionGrant
	if err := e.Client.Call(context.Background(), "bastions.grant", apitypes.BastionGrantIn{BastionID: id, Allow: []string{"inference", "egress"}, Models: []string{"llama3:8b"}}, &g); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bastion process to hold the grant", func() bool {
		conn, err := e.Client.ConnectLane(context.Background(), id, "inference/ollama")
		if err != nil {
			return false
		}
		defer conn.Close()
		st, _ := laneRequest(t, conn, bufio.NewReader(conn), "GET", "/api/version", "")
		return st == 200
	})
}

// checkOnlyTunnelPort lists pid's sockets: every UDP socket on one port
// (IPv4 and IPv6 of the tunnel), none of it loopback-only, and no TCP
// listener.
func checkOnlyTunnelPort(t *testing.T, pid int) {
	t.Helper()
	ss, err := sockets.ListeningSockets(pid)
	if err != nil {
		t.Fatal(err)
	}
	ports := map[uint16]bool{}
	for _, s := range ss {
		switch {
		case strings.HasPrefix(s.Proto, "tcp"):
			t.Errorf("the bastion process listens on TCP %s", s)
		case !s.Loopback():
			ports[s.Local.Port()] = true
		}
	}
	if len(ports) != 1 {
		t.Fatalf("the bastion process's sockets %v: want exactly one UDP port on non-loopback addresses", ss)
	}
}

// unpairAndWait unpairs the bastion and checks the process ends (status
// 3) with its tunnel down and its keys deleted.
func unpairAndWait(t *testing.T, e *testenv.Env, id, dir string, exited <-chan struct{}, stderr *bytes.Buffer) {
	t.Helper()
	if err := e.Client.Call(context.Background(), "bastions.unpair", apitypes.IDIn{ID: id}, nil); err != nil {
		t.Fatal(err)
	}
	// The tunnel goes down within 5 s of the unpair (the product's
	// promise, as for a revocation).
	waitForWithin(t, 5*time.Second, "the tunnel to go down", func() bool { return !e.CP.Lanes.Connected(id) })
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("bcd bastion run still running 20 s after the unpair\n%s", stderr.String())
	}
	for _, f := range []string{"wg.key", "identity.json", "grant-key.pin"} {
		if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			t.Errorf("%s still there after unpair (%v)", f, err)
		}
	}
	if _, err := e.Client.ConnectLane(context.Background(), id, "inference/ollama"); err == nil {
		t.Fatal("a lane opened to an unpaired bastion")
	}
}

// A pairing token works once: replayed, it is refused and nothing is
// paired; a token for another control plane (another join-key pin) is
// refused before it is sent. A lane to a forward the bastion does not
// serve finds nothing listening in the tunnel.
func TestBastionPairingTokenOnceAndNoListenerNoLane(t *testing.T) {
	e := bastionEnv(t, storetest.NewTestSQLite(t))
	other := bastionEnv(t, storetest.NewTestSQLite(t))
	ctx := context.Background()
	var tok, foreign apitypes.BastionPairToken
	if err := e.Client.Call(ctx, "bastions.pairToken", apitypes.BastionPairTokenIn{Name: "once"}, &tok); err != nil {
		t.Fatal(err)
	}
	if err := other.Client.Call(ctx, "bastions.pairToken", apitypes.BastionPairTokenIn{Name: "foreign"}, &foreign); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Pair(ctx, t.TempDir(), e.CP.GatewayAddr, foreign.Token, "foreign"); err == nil {
		t.Fatal("a token of another control plane paired")
	}
	if _, err := agent.Pair(ctx, t.TempDir(), e.CP.GatewayAddr, tok.Token, "once"); err != nil {
		t.Fatalf("first pairing: %v", err)
	}
	dir := t.TempDir()
	if _, err := agent.Pair(ctx, dir, e.CP.GatewayAddr, tok.Token, "again"); err == nil {
		t.Fatal("a replayed pairing token paired")
	}
	if _, err := os.Stat(filepath.Join(dir, "wg.key")); !os.IsNotExist(err) {
		t.Fatalf("a refused pairing left a key (%v)", err)
	}

	a := pairBastion(t, e, nil) // no forward served
	grantBastion(t, e, a, apitypes.BastionGrantIn{Allow: []string{"inference"}, Models: []string{"llama3:8b"}},
		func(p grant.Policy) bool { return p.Allows("inference") })
	_, err := e.Client.ConnectLane(ctx, a.ID(), "inference/ollama")
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Code != "UNAVAILABLE" {
		t.Fatalf("a lane with no listener behind it: %v, want UNAVAILABLE", err)
	}
}

// A service slot joins a lane to the server's Unix socket only with the
// `services` family and a reach grant naming that server: without the
// family it is refused services-not-granted, with the family but no reach
// grant for it reach-not-granted (both in the bastion's audit chain), and
// with both the bytes reach the server. Another server's reach grant does
// not open it.
func TestBastionServiceSlotNeedsServicesAndReach(t *testing.T) {
	e := bastionEnv(t, storetest.NewTestSQLite(t))
	sock := filepath.Join(t.TempDir(), "db.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = c.Write([]byte("db says hi\n")) }()
		}
	}()
	a := pairBastionWith(t, e, agent.Config{Services: []agent.Service{{Name: "db", Path: sock}, {Name: "other", Path: sock}}})
	try := func() string {
		conn, err := e.Client.ConnectLane(context.Background(), a.ID(), "service/db")
		if err != nil {
			t.Fatalf("connect service/db: %v", err)
		}
		defer conn.Close()
		line, _ := bufio.NewReader(conn).ReadString('\n')
		return line
	}
	lastRefusal := func() string {
		evs, err := a.AuditSince(0)
		if err != nil {
			t.Fatal(err)
		}
		for i := len(evs) - 1; i >= 0; i-- {
			if evs[i].Kind == "refuse" && evs[i].Lane == "service/db" {
				return evs[i].Reason
			}
		}
		return ""
	}
	if got := try(); got != "" {
		t.Fatalf("no grant: the server answered %q", got)
	}
	waitFor(t, "the refusal in the audit chain", func() bool { return lastRefusal() == "services-not-granted" })
	grantBastion(t, e, a, apitypes.BastionGrantIn{Allow: []string{"services"}, Reach: []string{"other"}},
		func(p grant.Policy) bool { return p.Allows("services") })
	if got := try(); got != "" {
		t.Fatalf("another server's reach grant: the server answered %q", got)
	}
	waitFor(t, "the refusal in the audit chain", func() bool { return lastRefusal() == "reach-not-granted" })
	grantBastion(t, e, a, apitypes.BastionGrantIn{Allow: []string{"services"}, Reach: []string{"db"}},
		func(p grant.Policy) bool { return p.Reaches("db") })
	if got := try(); got != "db says hi\n" {
		t.Fatalf("with services and reach: %q, want the server's line", got)
	}
}

// Revoking a bastion's certificate (not an unpair) also ends it: its
// stream is closed, its tunnel peer removed within 5 s, and the bastion
// stops with ErrRevoked, its tunnel down and its keys deleted.
func TestBastionRevokedCertificateEndsTunnelAndKeys(t *testing.T) {
	e := bastionEnv(t, storetest.NewTestSQLite(t))
	ctx := context.Background()
	var tok apitypes.BastionPairToken
	if err := e.Client.Call(ctx, "bastions.pairToken", apitypes.BastionPairTokenIn{Name: "rev"}, &tok); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	id, err := agent.Pair(ctx, dir, e.CP.GatewayAddr, tok.Token, "rev")
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.Open(ctx, agent.Config{DataDir: dir, Log: e.Log})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	waitFor(t, "the tunnel", func() bool { return e.CP.Lanes.Connected(id) })
	if err := e.Client.Call(ctx, "nodes.revoke", apitypes.NodeRevokeIn{NodeID: id}, nil); err != nil {
		t.Fatal(err)
	}
	waitForWithin(t, 5*time.Second, "the revoked bastion's tunnel to go", func() bool { return !e.CP.Lanes.Connected(id) })
	select {
	case err := <-done:
		if !errors.Is(err, agent.ErrRevoked) {
			t.Fatalf("Run = %v, want ErrRevoked", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the revoked bastion still runs")
	}
	if a.TunnelPort() != 0 {
		t.Fatal("the revoked bastion's tunnel is still up")
	}
	for _, f := range []string{"wg.key", "identity.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			t.Errorf("%s still there after the revocation (%v)", f, err)
		}
	}
}

// An open lane is re-decided as a tunnel is: revoking the caller's API
// key closes it (the client's read ends), with no sleep: the read blocks
// until the close.
func TestBastionLaneClosedWhenKeyRevoked(t *testing.T) {
	e := bastionEnv(t, storetest.NewTestSQLite(t))
	srv := fakeOllama(t)
	a := pairBastion(t, e, map[forward.Kind]string{forward.KindOllama: srv.Listener.Addr().String()})
	grantBastion(t, e, a, apitypes.BastionGrantIn{Allow: []string{"inference"}, Models: []string{"llama3:8b"}},
		func(p grant.Policy) bool { return p.Allows("inference") })
	ctx := context.Background()
	id, err := e.Client.CreateIdentity(ctx, "", "laner", "person")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Client.Bind(ctx, "", id.ID, "admin"); err != nil {
		t.Fatal(err)
	}
	k, err := e.Client.CreateAPIKey(ctx, "", id.ID, "lane", 0)
	if err != nil {
		t.Fatal(err)
	}
	c := e.NewClient(t, k.Key)
	conn, err := c.ConnectLane(ctx, a.ID(), "inference/ollama")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	if st, body := laneRequest(t, conn, br, "GET", "/api/version", ""); st != 200 {
		t.Fatalf("before: %d %s", st, body)
	}
	if err := e.Client.Call(ctx, "apiKeys.revoke", apitypes.IDIn{ID: k.ID}, nil); err != nil {
		t.Fatal(err)
	}
	// A lane left open fails the test instead of hanging it.
	var leftOpen atomic.Bool
	defer time.AfterFunc(30*time.Second, func() { leftOpen.Store(true); conn.Close() }).Stop()
	_, _ = io.Copy(io.Discard, br)
	if leftOpen.Load() {
		t.Fatal("the lane stayed open after its caller's key was revoked")
	}
}
