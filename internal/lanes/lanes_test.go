package lanes

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/bastion/wgtun"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// fixedSource answers one key and one peer.
type fixedSource struct {
	key  wgtun.Key
	peer Peer
}

func (s fixedSource) LanesKey(context.Context) (string, error) { return s.key.String(), nil }
func (s fixedSource) Peers(context.Context) ([]Peer, error)    { return []Peer{s.peer}, nil }

// opsPair starts the role with one bastion peer and brings that bastion's
// own tunnel end up, dialling the role; it returns the role and the
// bastion's tunnel.
func opsPair(t *testing.T) (*Role, *wgtun.Tunnel) {
	t.Helper()
	hostKey, _ := wgtun.GenerateKey()
	bKey, _ := wgtun.GenerateKey()
	bAddr := netip.MustParseAddr("100.100.0.2")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	src := fixedSource{key: hostKey, peer: Peer{BastionID: "nbastion", PublicKey: bKey.Public().String(), Addr: bAddr}}
	r, err := Start(ctx, Config{Listen: "127.0.0.1:0", Source: src, Poke: bus.New(), Clock: clock.Real{}})
	if err != nil {
		t.Fatal(err)
	}
	r.Activate("nbastion")
	if err := r.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	ep, _ := netip.ParseAddrPort(r.Endpoint())
	b, err := wgtun.Up(wgtun.Config{PrivateKey: bKey, Address: bAddr, ListenAddr: netip.MustParseAddr("127.0.0.1"),
		Peers: []wgtun.Peer{{PublicKey: hostKey.Public(), AllowedIP: netip.PrefixFrom(HostAddr, 32), Endpoint: ep, Keepalive: 25 * time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	// The bastion speaks first, as a real one does (its hello precedes any
	// op): one connection to the role's egress port completes the bastion's
	// own handshake, so the role's first dial never races it. (Two crossing
	// first handshakes can leave wireguard-go's session one-way until its
	// 15 s re-handshake, which outlasts the dial's SYN retries.)
	c, err := b.DialContext(ctx, "tcp", netip.AddrPortFrom(HostAddr, EgressPort).String())
	if err != nil {
		t.Fatalf("the bastion's first connection to the role: %v", err)
	}
	c.Close()
	return r, b
}

// TestDialOpsReachesOnlyTheOpsPort: DialOps reaches the bastion's listener
// on PortOps through the tunnel; with nothing listening there it is
// UNAVAILABLE; a bastion without a tunnel is INVALID_STATE.
func TestDialOpsReachesOnlyTheOpsPort(t *testing.T) {
	r, b := opsPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := r.DialOps(ctx, "nbastion"); errs.CodeOf(err) != errs.Unavailable {
		t.Fatalf("nothing listening on the ops port: %v, want UNAVAILABLE", err)
	}
	ln, err := b.ListenTCP(PortOps)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte("ops"))
	}()
	c, err := r.DialOps(ctx, "nbastion")
	if err != nil {
		t.Fatalf("DialOps: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "ops" {
		t.Fatalf("read %q %v", got, err)
	}
	if _, err := r.DialOps(ctx, "nother"); !errors.Is(err, errNoTunnel) {
		t.Fatalf("a bastion without a tunnel: %v", err)
	}
}

// TestNoLaneReachesTheOpsPort: no lane name, whatever services the bastion
// declares, maps to PortOps (the public lane endpoint never reaches the
// ops server; a service slot is at most SlotLastPort).
func TestNoLaneReachesTheOpsPort(t *testing.T) {
	svcs := make([]string, SlotLastPort-SlotFirstPort+1)
	for i := range svcs {
		svcs[i] = "s" + strconv.Itoa(i)
	}
	svcs = append(svcs, "ops", "overflow")
	for _, lane := range []string{"ops", "inference/ops", "service/ops", "service/overflow", "service/18400", "ops/18400",
		"inference/llm", "inference/ollama", "inference/pii", "service/s0", "service/s99", strconv.Itoa(PortOps)} {
		port, err := lanePort(lane, svcs)
		if port == PortOps || err == nil && (port < SlotFirstPort || port > SlotLastPort) && port != PortOllama && port != PortLLM && port != PortPII {
			t.Fatalf("lane %q maps to port %d", lane, port)
		}
	}
}

// FuzzLanePort: no lane string maps to PortOps, EgressPort or any port
// outside the inference ports and the service slots.
func FuzzLanePort(f *testing.F) {
	f.Add("service/ops")
	f.Add("inference/llm")
	f.Add("ops")
	f.Fuzz(func(t *testing.T, lane string) {
		svcs := []string{"a", "ops", "b"}
		port, err := lanePort(lane, svcs)
		if err != nil {
			return
		}
		if port != PortOllama && port != PortLLM && port != PortPII && (port < SlotFirstPort || port > SlotLastPort) {
			t.Fatalf("lane %q maps to port %d", lane, port)
		}
	})
}
