package integration

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/bettercompute/bettercompute/internal/cli"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/config"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/internalv1"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestGatewayOnlyProcessHoldsNoKeys runs a gateway-only process the way
// `serve --roles gateway` does (cli.Serve, the function the command runs)
// from the files `pki issue-gateway` writes, with no key-encryption key:
// it cannot issue a certificate or sign anything itself, and a join, a
// renewal and a secret release through it work, relayed to the api over
// the internal channel.
func TestGatewayOnlyProcessHoldsNoKeys(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		out := filepath.Join(t.TempDir(), "gw")
		var stdout, stderr syncBuffer
		if code := cli.Main([]string{"pki", "issue-gateway", "--pki", filepath.Join(e.Dir, "pki"), "--kek-file", filepath.Join(e.Dir, "kek"), "--out", out}, &stdout, &stderr); code != 0 {
			t.Fatalf("pki issue-gateway: exit %d: %s", code, stderr.Bytes())
		}
		// The gateway's directory holds no sealed key at all.
		raw, err := os.ReadFile(filepath.Join(out, pki.BundleFile))
		if err != nil {
			t.Fatal(err)
		}
		var onDisk struct {
			Sealed map[string][]byte `json:"sealed"`
		}
		if err := json.Unmarshal(raw, &onDisk); err != nil || len(onDisk.Sealed) != 0 {
			t.Fatalf("the gateway's bundle.json holds sealed keys: %v (%v)", onDisk.Sealed, err)
		}
		if fi, err := os.Stat(filepath.Join(out, pki.GatewayKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("gateway.key: %v %v", fi, err)
		}

		cfg := config.Default()
		cfg.Roles = []string{server.RoleGateway}
		cfg.PKI.Dir = out
		cfg.PKI.KEKFile = filepath.Join(t.TempDir(), "no-kek-here")
		cfg.Gateway.Listen = "127.0.0.1:0"
		cfg.Gateway.CertFile, cfg.Gateway.KeyFile = filepath.Join(out, pki.GatewayCertFile), filepath.Join(out, pki.GatewayKeyFile)
		cfg.Gateway.Control = e.CP.InternalAddr
		if err := cfg.Validate(); err != nil {
			t.Fatalf("gateway-only config: %v", err)
		}
		sctx, stop := context.WithCancel(ctx)
		started := make(chan *server.ControlPlane, 1)
		done := make(chan error, 1)
		go func() { done <- cli.Serve(sctx, cfg, e.Log, db, func(cp *server.ControlPlane) { started <- cp }) }()
		var gw *server.ControlPlane
		select {
		case gw = <-started:
		case err := <-done:
			t.Fatalf("gateway-only serve: %v", err)
		case <-time.After(testenv.WaitTimeout):
			t.Fatal("gateway-only serve did not start")
		}
		t.Cleanup(func() { stop(); <-done })

		// Nothing in it can sign or issue.
		if gw.Signer != nil || gw.Secrets != nil || gw.APIAddr != "" {
			t.Fatalf("gateway-only process runs signer=%v secrets=%v api=%q", gw.Signer != nil, gw.Secrets != nil, gw.APIAddr)
		}
		key, _ := pki.NewNodeKey()
		csr, _ := pki.CSR(key, "x")
		tok, err := e.CP.Nodes.CreateJoinToken(ctx, admin, pki.RoleNode, "direct", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := gw.Nodes.Join(ctx, tok.Token, csr, "direct"); errs.CodeOf(err) != errs.Internal {
			t.Fatalf("the gateway process issued a certificate itself: %v", err)
		}

		// Join through it.
		tok, err = e.CP.Nodes.CreateJoinToken(ctx, admin, pki.RoleNode, "via-gw", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(t.TempDir(), "node")
		if _, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: dir, Gateway: gw.GatewayAddr, Token: tok.Token, Name: "via-gw"}); err != nil {
			t.Fatalf("join through the gateway-only process: %v", err)
		}
		n := e.OpenNodeAt(t, dir, "", gw.GatewayAddr)
		// The node's signed desired state comes through it too: the api
		// signs it over the internal channel (the process holds no key).
		if nodeIntent(t, n) == nil {
			t.Fatal("no desired state through the gateway-only process")
		}
		n.WaitConnected(t)

		// Renew through it, then reconnect with the new certificate.
		conn, err := n.Dial()
		if err != nil {
			t.Fatal(err)
		}
		before := n.Serial()
		if err := n.Renew(ctx, conn); err != nil {
			t.Fatalf("renew through the gateway-only process: %v", err)
		}
		conn.Close()
		if n.Serial() == before {
			t.Fatal("renewal kept the serial")
		}
		stopNode(t, db, n)
		n2 := e.OpenNodeAt(t, dir, "", gw.GatewayAddr)
		n2.Start(t)
		n2.WaitConnected(t)

		// A secret released through it.
		value := []byte("gw-only-secret")
		if err := e.Client.Call(ctx, "secrets.put", map[string]any{"name": "gwdemo", "value_base64": base64.StdEncoding.EncodeToString(value)}, nil); err != nil {
			t.Fatal(err)
		}
		c, err := e.Client.CreateCommand(ctx, n2.NodeID(), "secret.digest", json.RawMessage(`{"ref":"secret://root/gwdemo","nonce":"00112233445566778899aabbccddeeff"}`))
		if err != nil {
			t.Fatal(err)
		}
		got := e.WaitCommand(t, c.ID)
		nonce, _ := hex.DecodeString("00112233445566778899aabbccddeeff")
		mac := hmac.New(sha256.New, value)
		mac.Write(nonce)
		var res struct {
			HMAC string `json:"hmac_sha256"`
		}
		if err := json.Unmarshal(got.Result, &res); err != nil || got.State != "succeeded" || res.HMAC != hex.EncodeToString(mac.Sum(nil)) {
			t.Fatalf("secret.digest through the gateway-only process: %s result=%s reason=%q", got.State, got.Result, got.Reason)
		}
		var releases int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE action = 'compute:secrets:release' AND resource = 'secret://root/gwdemo'`).Scan(&releases); err != nil || releases != 1 {
			t.Fatalf("%d release audit rows (%v), want 1", releases, err)
		}
	})
}

// TestInternalChannelIsMutualTLSUnderInternalCA: the api's internal channel
// answers only a gateway certificate from the internal CA; no client
// certificate, or a node's, is refused at the handshake.
func TestInternalChannelIsMutualTLSUnderInternalCA(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx, cancel := context.WithTimeout(context.Background(), testenv.WaitTimeout)
		defer cancel()
		call := func(cert *tls.Certificate) error {
			cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
			if cert != nil {
				cfg.Certificates = []tls.Certificate{*cert}
			}
			conn, err := grpc.NewClient(e.CP.InternalAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_, err = internalv1.NewGatewayServicesClient(conn).Bundle(ctx, &internalv1.BundleRequest{})
			return err
		}
		if err := call(nil); status.Code(err) != codes.Unavailable {
			t.Fatalf("no client certificate: %v, want a refused handshake", err)
		}
		nodeCert, err := e.Nodes[0].ClientCertificate()
		if err != nil {
			t.Fatal(err)
		}
		if err := call(nodeCert); status.Code(err) != codes.Unavailable {
			t.Fatalf("a node's certificate: %v, want a refused handshake", err)
		}
		dir := e.GatewayFiles(t)
		gwCert, err := pki.LoadGatewayCert(filepath.Join(dir, pki.GatewayCertFile), filepath.Join(dir, pki.GatewayKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		if err := call(&gwCert); err != nil {
			t.Fatalf("the gateway's certificate: %v", err)
		}

		// The api verifies again the node chain a gateway forwards: one from
		// another node CA is refused before any renewal.
		kek, _ := pki.CreateKEK(filepath.Join(t.TempDir(), "kek"))
		rogueCA, err := pki.Init(filepath.Join(t.TempDir(), "pki"), e.Bundle.TrustDomain, kek, clock.Real{})
		if err != nil {
			t.Fatal(err)
		}
		rogueKey, _ := rogueCA.NodeCAKey(kek)
		nkey, _ := pki.NewNodeKey()
		ncsr, _ := pki.CSR(nkey, "rogue")
		leaf, err := pki.IssueNodeCert(rogueCA.NodeCA, rogueKey, ncsr, rogueCA.TrustDomain, e.Nodes[0].NodeID(), pki.RoleNode, time.Hour, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		gconn, err := grpc.NewClient(e.CP.InternalAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, Certificates: []tls.Certificate{gwCert}})))
		if err != nil {
			t.Fatal(err)
		}
		defer gconn.Close()
		_, err = internalv1.NewGatewayServicesClient(gconn).Renew(ctx, &internalv1.RenewRequest{NodeChainDer: [][]byte{leaf}, CsrDer: ncsr})
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("renew with a forwarded chain from another CA: %v, want Unauthenticated", err)
		}

		// A gateway told to relay to a server under the internal CA that is
		// not the api (another gateway's certificate) relays nothing.
		impostor := &countingServices{}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{gwCert}})))
		internalv1.RegisterGatewayServicesServer(gs, impostor)
		go func() { _ = gs.Serve(lis) }()
		defer gs.Stop()
		rogue := e.StartGatewayWith(t, func(o *server.Options) { o.Control = lis.Addr().String() })
		tok, err := e.CP.Nodes.CreateJoinToken(ctx, admin, pki.RoleNode, "nope", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: filepath.Join(t.TempDir(), "n"), Gateway: rogue.GatewayAddr, Token: tok.Token, Name: "nope"}); err == nil {
			t.Fatal("a join went through a gateway relaying to an impostor")
		}
		if n := impostor.calls.Load(); n != 0 {
			t.Fatalf("the impostor received %d relayed calls", n)
		}

	})
}

// countingServices is an internal channel server that counts the calls it
// receives and answers none.
type countingServices struct {
	internalv1.UnimplementedGatewayServicesServer
	calls atomic.Int64
}

func (c *countingServices) Bundle(context.Context, *internalv1.BundleRequest) (*internalv1.BundleResponse, error) {
	c.calls.Add(1)
	return nil, status.Error(codes.Internal, "impostor")
}

func (c *countingServices) Join(context.Context, *internalv1.JoinRequest) (*internalv1.JoinResponse, error) {
	c.calls.Add(1)
	return nil, status.Error(codes.Internal, "impostor")
}
