package daemon_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/jointoken"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// joinToken makes a join token on e.
func joinToken(t *testing.T, e *testenv.Env) string {
	t.Helper()
	tok, err := e.CP.Nodes.CreateJoinToken(context.Background(), audit.Entry{TenantID: "root", Actor: "test"}, "node", "x", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok.Token
}

// tokenUnspent fails the test if a token was used or a join attempt
// reached the real gateway.
func tokenUnspent(t *testing.T, e *testenv.Env) {
	t.Helper()
	ctx := context.Background()
	var used int
	if err := e.CP.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM join_tokens WHERE used_at IS NOT NULL`).Scan(&used); err != nil || used != 0 {
		t.Fatalf("token spent (%d, %v): it was sent to an unverified gateway", used, err)
	}
	evs, err := e.CP.Events.List(ctx, "security.join.refused")
	if err != nil || len(evs) != 0 {
		t.Fatalf("the gateway saw a join attempt: %v %v", evs, err)
	}
}

// A token must not be sent to a gateway that is not the one the token was
// made for: the signed bundle must verify under the token's pin, and the
// connection that carries the token must verify to the bundle's server
// roots with the gateway SPIFFE ID (a server serving the genuine bundle,
// which anyone can fetch, proves nothing).
func TestJoinRefusesGatewayWithWrongPin(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	ctx := context.Background()
	join := func(gateway, token string) error {
		_, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: filepath.Join(t.TempDir(), "n"), Gateway: gateway, Token: token, Name: "x"})
		return err
	}

	t.Run("flipped pin", func(t *testing.T) {
		parsed, err := jointoken.Parse(joinToken(t, e))
		if err != nil {
			t.Fatal(err)
		}
		parsed.Pin[0] ^= 1
		err = join(e.CP.GatewayAddr, parsed.String())
		if err == nil || !strings.Contains(err.Error(), "does not match the token's pin") {
			t.Fatalf("got %v, want a pin mismatch", err)
		}
		tokenUnspent(t, e)
	})

	t.Run("gateway certificate from a foreign CA", func(t *testing.T) {
		foreign, kek := foreignPKI(t, e.Bundle.TrustDomain)
		addr, creds, imp := newImpostor(t, e, gatewayCert(t, foreign, kek, e.Bundle.TrustDomain))
		err := join(addr, joinToken(t, e))
		if err == nil || !strings.Contains(err.Error(), "gateway certificate does not verify") {
			t.Fatalf("got %v, want the gateway certificate refused", err)
		}
		noToken(t, imp)
		// Only the bundle's connection completed a handshake: the one for
		// the token was refused inside it.
		if n := creds.handshakes.Load(); n != 1 {
			t.Fatalf("%d handshakes completed, want 1 (the bundle's)", n)
		}
		tokenUnspent(t, e)
	})

	t.Run("right CA, wrong SPIFFE id", func(t *testing.T) {
		addr, creds, imp := newImpostor(t, e, gatewayCert(t, e.Bundle, e.KEK, "other.bc.local"))
		err := join(addr, joinToken(t, e))
		if err == nil || !strings.Contains(err.Error(), "lacks the gateway SPIFFE ID") {
			t.Fatalf("got %v, want the gateway SPIFFE ID missing", err)
		}
		noToken(t, imp)
		if n := creds.handshakes.Load(); n != 1 {
			t.Fatalf("%d handshakes completed, want 1 (the bundle's)", n)
		}
		tokenUnspent(t, e)
	})
}

// TestJoinTokenNeverFollowsReconnect replays the attack of issue 14 item
// 1: an on-path relay sends the first connection to the real gateway,
// drops it as soon as Bundle was answered, and sends every later
// connection to a server with a foreign CA's certificate. The token must
// never reach it (not one application byte does), and Join fails naming
// the certificate.
func TestJoinTokenNeverFollowsReconnect(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	real, realCreds := serve(t, e.CP.Gateway.TLSConfig(), e.CP.Gateway, true)
	foreign, kek := foreignPKI(t, e.Bundle.TrustDomain)
	fake, fakeCreds, imp := newImpostor(t, e, gatewayCert(t, foreign, kek, e.Bundle.TrustDomain))
	r := startRelay(t, func(i int64) string {
		if i == 0 {
			return real
		}
		return fake
	})
	_, err := daemon.Join(context.Background(), daemon.JoinOptions{DataDir: filepath.Join(t.TempDir(), "n"), Gateway: r.addr(), Token: joinToken(t, e), Name: "x"})
	if err == nil || !strings.Contains(err.Error(), "gateway certificate does not verify") {
		t.Fatalf("got %v, want the reconnect's certificate refused", err)
	}
	if realCreds.handshakes.Load() != 1 || r.count.Load() < 2 {
		t.Fatalf("the relay saw %d connections (%d to the real gateway): the attack did not take place", r.count.Load(), realCreds.handshakes.Load())
	}
	noToken(t, imp)
	if n, b := fakeCreds.handshakes.Load(), fakeCreds.bytesRead.Load(); n != 0 || b != 0 {
		t.Fatalf("the foreign server completed %d handshakes and read %d bytes, want none", n, b)
	}
	tokenUnspent(t, e)
}
