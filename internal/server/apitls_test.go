package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// startTLS starts a control plane whose API serves TLS, as serve does by
// default, with a certificate issued from the internal CA.
func startTLS(t *testing.T) *testenv.Env {
	return testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Tune: func(o *server.Options) { o.APIPlainHTTP = false }})
}

// The API's TLS listener answers a plain-HTTP request 400 without reading
// it (an API key sent in clear is never used), and answers over TLS with a
// certificate from the internal CA for spiffe://<td>/api.
func TestAPIRefusesPlainHTTPOnItsTLSListener(t *testing.T) {
	e := startTLS(t)
	ctx := context.Background()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+e.CP.APIAddr+"/api/v1/nodes.list", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.AdminKey)
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "Client sent an HTTP request to an HTTPS server") {
		t.Fatalf("plain HTTP on the TLS listener: %d %q", resp.StatusCode, body)
	}

	if _, err := e.Client.Nodes(ctx); err != nil {
		t.Fatalf("nodes.list over TLS: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.Bundle.APICAPEM())
	conn, err := tls.Dial("tcp", e.CP.APIAddr, &tls.Config{RootCAs: roots, ServerName: "localhost"})
	if err != nil {
		t.Fatalf("TLS to the API by the name localhost: %v", err)
	}
	defer conn.Close()
	leaf := conn.ConnectionState().PeerCertificates[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != pki.APISPIFFEID(e.Bundle.TrustDomain).String() {
		t.Fatalf("API certificate URIs %v", leaf.URIs)
	}
}

// Start refuses plain HTTP on an address that is not loopback without
// trusted proxies (INVALID_CONFIG), and plain HTTP with the operator's own
// certificate; it serves plain HTTP on loopback only when asked.
func TestStartRefusesPlainHTTPOffLoopback(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	kek, err := pki.CreateKEK(filepath.Join(dir, "kek"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := pki.Init(filepath.Join(dir, "pki"), "srv.bc.local", kek, clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	db := storetest.NewTestSQLite(t)
	api := []string{server.RoleAPI}
	for name, o := range map[string]server.Options{
		"every interface": {APIListen: "0.0.0.0:0", APIPlainHTTP: true},
		"no host":         {APIListen: ":0", APIPlainHTTP: true},
		"a public name":   {APIListen: "bc.example.com:7780", APIPlainHTTP: true},
		"with cert_file":  {APIListen: "127.0.0.1:0", APIPlainHTTP: true, APICert: &tls.Certificate{}},
	} {
		t.Run(name, func(t *testing.T) {
			o.DB, o.Bundle, o.KEK, o.Roles, o.Log = db, b, kek, api, testenv.Logger(t)
			cp, err := server.Start(ctx, o)
			if errs.CodeOf(err) != errs.InvalidConfig || !strings.Contains(err.Error(), "api.plain_http") {
				if cp != nil {
					cp.Close()
				}
				t.Fatalf("Start: %v, want INVALID_CONFIG naming api.plain_http", err)
			}
		})
	}
}

// A gateway that issues its own certificate (with the api role) issues it
// again once half its lifetime has passed, and serves the new one on the
// next handshake, so a serve running longer than the certificate's life
// never presents an expired one.
func TestGatewayCertificateIsReissuedAtHalfLife(t *testing.T) {
	clk := clock.NewFake(time.Now())
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Clock: clk})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.Bundle.APICAPEM())
	leaf := func() *x509.Certificate {
		t.Helper()
		conn, err := tls.Dial("tcp", e.CP.GatewayAddr, &tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS13,
			// The gateway's certificate is checked against the fake
			// clock's time, as a node whose clock moved with it would.
			Time: clk.Now})
		if err != nil {
			t.Fatalf("TLS to the gateway: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0]
	}
	first := leaf()
	life := first.NotAfter.Sub(clk.Now())
	clk.Advance(life/2 - time.Minute)
	if again := leaf(); !again.NotAfter.Equal(first.NotAfter) {
		t.Fatalf("reissued before half its life: %v, then %v", first.NotAfter, again.NotAfter)
	}
	clk.Advance(2 * time.Minute)
	if renewed := leaf(); !renewed.NotAfter.After(first.NotAfter) {
		t.Fatalf("not reissued after half its life: still until %v", renewed.NotAfter)
	}
}

// The internal channel's certificate, which gateway-only processes verify
// on every connection, is reissued at half its life too: after seven days
// of uptime they would otherwise reach nothing.
func TestInternalChannelCertificateIsReissuedAtHalfLife(t *testing.T) {
	clk := clock.NewFake(time.Now())
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Clock: clk,
		Tune: func(o *server.Options) { o.InternalListen = "127.0.0.1:0" }})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.Bundle.APICAPEM())
	leaf := func() *x509.Certificate {
		t.Helper()
		var got *x509.Certificate
		conn, err := tls.Dial("tcp", e.CP.InternalAddr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13, Time: clk.Now,
			VerifyConnection: func(cs tls.ConnectionState) error { got = cs.PeerCertificates[0]; return nil }})
		if err == nil {
			conn.Close()
		}
		if got == nil {
			t.Fatalf("TLS to the internal channel: %v", err)
		}
		return got
	}
	first := leaf()
	clk.Advance(first.NotAfter.Sub(clk.Now())/2 - time.Minute)
	if again := leaf(); !again.NotAfter.Equal(first.NotAfter) {
		t.Fatalf("reissued before half its life: %v, then %v", first.NotAfter, again.NotAfter)
	}
	clk.Advance(2 * time.Minute)
	if renewed := leaf(); !renewed.NotAfter.After(first.NotAfter) {
		t.Fatalf("not reissued after half its life: still until %v", renewed.NotAfter)
	}
}
