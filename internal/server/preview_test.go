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

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previews"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// The preview role serves TLS under the API's CA (by the name localhost)
// and answers a preview path with a token that does not verify with the
// one constant 404.
func TestPreviewRoleServesTLS(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{SandboxRuntime: "sim", Tune: func(o *server.Options) { o.APIPlainHTTP = false }})
	if e.CP.PreviewAddr == "" {
		t.Fatal("no preview role")
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.Bundle.APICAPEM())
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "localhost"}}}
	res, err := cl.Get("https://" + e.CP.PreviewAddr + "/p/sbxnone/8080/v1.0123456789abcdef.e30.x/")
	if err != nil {
		t.Fatalf("GET over TLS: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound || string(body) != previews.NotFoundBody {
		t.Fatalf("a bad token: %d %q", res.StatusCode, body)
	}
}

// The preview role runs only with the api and gateway roles in its
// process (INVALID_CONFIG otherwise).
func TestPreviewRoleNeedsAPIAndGateway(t *testing.T) {
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
	for name, roles := range map[string][]string{
		"without the gateway": {server.RoleAPI, server.RoleWorkers, server.RolePreview},
		"without the api":     {server.RoleWorkers, server.RoleGateway, server.RolePreview},
	} {
		t.Run(name, func(t *testing.T) {
			cp, err := server.Start(ctx, server.Options{DB: db, Bundle: b, KEK: kek, Roles: roles, Log: testenv.Logger(t), APIListen: "127.0.0.1:0", APIPlainHTTP: true})
			if errs.CodeOf(err) != errs.InvalidConfig || !strings.Contains(err.Error(), "preview role") {
				if cp != nil {
					cp.Close()
				}
				t.Fatalf("Start: %v, want INVALID_CONFIG naming the preview role", err)
			}
		})
	}
}
