package agent

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/bastion/chainlog"
	"github.com/bettercompute/bettercompute/internal/bastion/forward"
	"github.com/bettercompute/bettercompute/internal/bastion/grant"
	"github.com/bettercompute/bettercompute/internal/bastion/sockets"
	"github.com/bettercompute/bettercompute/internal/bastion/wgtun"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// bareAgent is an Agent with its keys and audit chain but no session, for
// the configuration rules.
func bareAgent(t *testing.T) *Agent {
	t.Helper()
	dir := t.TempDir()
	k, err := wgtun.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	al, err := chainlog.Open(filepath.Join(dir, auditFile), clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{cfg: Config{DataDir: dir, Clock: clock.Real{}, Log: slog.New(slog.DiscardHandler)}, wgKey: k, audit: al,
		streams: forward.NewStreams(MaxStreams), notify: make(chan struct{}, 1)}
	a.grants.Store(&[]grant.Doc{})
	t.Cleanup(func() { a.downTunnel(); al.Close() })
	return a
}

// config is a well-formed tunnel configuration with hostAddr as the
// host's allowed address.
func config(t *testing.T, hostAddr string) *nodev1.BastionConfig {
	t.Helper()
	hk, err := wgtun.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	_, vkey, err := grant.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return &nodev1.BastionConfig{HostPublicKey: hk.Public().String(), HostEndpoint: "127.0.0.1:9", HostAddress: hostAddr,
		BastionAddress: "100.100.0.2/32", GrantVerifyKey: vkey, EgressPort: 18300}
}

// udpSockets counts this process's UDP sockets.
func udpSockets(t *testing.T) int {
	t.Helper()
	ss, err := sockets.ListeningSockets(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range ss {
		if strings.HasPrefix(s.Proto, "udp") {
			n++
		}
	}
	return n
}

// A configuration whose host allowed address is wider than one address
// is refused with wgtun's reason: no tunnel comes up, no UDP socket is
// opened, and the refusal is in the on-machine audit chain. The same
// configuration with a single address brings the tunnel up.
func TestWideAllowedAddressBringsNoTunnel(t *testing.T) {
	for _, wide := range []string{"100.100.0.0/16", "0.0.0.0/0", "100.100.0.1/31", "::/0"} {
		a := bareAgent(t)
		before := udpSockets(t)
		err := a.applyConfig(context.Background(), config(t, wide))
		var re *wgtun.RefusedError
		if !errors.As(err, &re) || re.Reason != wgtun.ReasonWideAllowedIP {
			t.Fatalf("%s: applyConfig = %v, want %s", wide, err, wgtun.ReasonWideAllowedIP)
		}
		if a.TunnelPort() != 0 || udpSockets(t) != before {
			t.Fatalf("%s: a tunnel came up (port %d, udp sockets %d -> %d)", wide, a.TunnelPort(), before, udpSockets(t))
		}
		evs, err := a.audit.Since(0, 10)
		if err != nil || len(evs) != 1 || evs[0].Kind != "refuse" || evs[0].Reason != wgtun.ReasonWideAllowedIP {
			t.Fatalf("%s: audit %+v %v, want one refuse %s", wide, evs, err, wgtun.ReasonWideAllowedIP)
		}
	}
	a := bareAgent(t)
	if err := a.applyConfig(context.Background(), config(t, "100.100.0.1/32")); err != nil || a.TunnelPort() == 0 {
		t.Fatalf("single address: %v, port %d", err, a.TunnelPort())
	}
}

// The grant key is pinned on first use: a configuration naming another key
// later is refused and takes the tunnel down.
func TestGrantKeyPinnedOnFirstUse(t *testing.T) {
	a := bareAgent(t)
	c := config(t, "100.100.0.1/32")
	if err := a.applyConfig(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	other := config(t, "100.100.0.1/32")
	other.HostPublicKey = c.HostPublicKey
	if err := a.applyConfig(context.Background(), other); !errors.Is(err, errGrantKeyChanged) {
		t.Fatalf("another grant key: %v, want %v", err, errGrantKeyChanged)
	}
	if a.TunnelPort() != 0 {
		t.Fatal("the tunnel stayed up under another grant key")
	}
}
