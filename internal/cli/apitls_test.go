package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/devenv"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// The CLI verifies the API's TLS certificate against the CA it is given
// (--ca-file or BC_CA_FILE: a bundle directory or a PEM) and refuses a
// server whose certificate is from another CA, with ErrUntrustedServer;
// it refuses an https:// URL without a CA and plain http:// off loopback.
func TestCLIRefusesAServerCertificateFromAnotherCA(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Tune: func(o *server.Options) { o.APIPlainHTTP = false }})
	other := filepath.Join(t.TempDir(), "other")
	kek, err := pki.CreateKEK(other + ".kek")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Init(other, "other.bc.local", kek, clock.Real{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("BC_ADDR", e.APIURL())
	t.Setenv("BC_API_KEY", e.AdminKey)
	t.Setenv("BC_CA_FILE", other)
	code, out, errOut := run(t, "nodes", "list", "--json")
	if code != 1 || out != "" || !strings.Contains(errOut, client.ErrUntrustedServer.Error()) || !strings.Contains(errOut, "x509: certificate signed by unknown authority") {
		t.Fatalf("another CA: exit %d: %q %q", code, out, errOut)
	}
	pem := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(pem, e.Bundle.APICAPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ca := range []string{filepath.Join(e.Dir, "pki"), pem} {
		if code, out, errOut := run(t, "nodes", "list", "--json", "--ca-file", ca); code != 0 || strings.Join(strings.Fields(out), "") != `{"nodes":[]}` {
			t.Fatalf("--ca-file %s: exit %d: %q %q", ca, code, out, errOut)
		}
	}
	t.Setenv("BC_CA_FILE", "")
	if code, _, errOut := run(t, "nodes", "list"); code != 2 || !strings.Contains(errOut, "needs the control plane's CA") {
		t.Fatalf("no CA: exit %d: %q", code, errOut)
	}
	t.Setenv("BC_ADDR", "http://192.0.2.1:7780")
	if code, _, errOut := run(t, "nodes", "list"); code != 2 || !strings.Contains(errOut, "plain http:// to a non-loopback host") {
		t.Fatalf("plain http off loopback: exit %d: %q", code, errOut)
	}
}

// serve refuses plain HTTP on an address that is not loopback, without
// trusted proxies, before it reads any file: exit 2, INVALID_CONFIG naming
// api.plain_http and what to set.
func TestServeRefusesNonLoopbackPlainHTTP(t *testing.T) {
	dir := t.TempDir()
	base := []string{"serve", "--db", "sqlite:" + filepath.Join(dir, "bc.db"), "--pki", filepath.Join(dir, "pki"), "--kek-file", filepath.Join(dir, "kek"), "--plain-http"}
	code, _, errOut := run(t, append(base, "--api", "0.0.0.0:7780")...)
	if code != 2 || !strings.Contains(errOut, "INVALID_CONFIG") || !strings.Contains(errOut, "api.plain_http: plain HTTP would send API keys in clear") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	toml := filepath.Join(dir, "bc.toml")
	if err := os.WriteFile(toml, []byte("[api]\nlisten = \"192.0.2.1:7780\"\nplain_http = true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = run(t, "serve", "--config", toml)
	if code != 2 || !strings.Contains(errOut, "INVALID_CONFIG") || !strings.Contains(errOut, "api.plain_http") {
		t.Fatalf("from the file: exit %d: %s", code, errOut)
	}
}

// dev serves its API over TLS and DATA/env exports what the CLI needs
// (BC_ADDR https://, BC_API_KEY_FILE, BC_CA_FILE): with exactly that
// environment the CLI lists the fleet.
func TestDevEnvWorksWithTheCLIOverTLS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev")
	e, err := devenv.Start(context.Background(), devenv.Options{DataDir: dir, Nodes: 1, APIListen: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0", Log: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	b, err := os.ReadFile(e.EnvFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("BC_API_KEY", "")
	t.Setenv("BC_CA_FILE", "")
	vars := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok {
			t.Fatalf("env line %q", line)
		}
		vars[k] = strings.Trim(v, "'")
		t.Setenv(k, vars[k])
	}
	if !strings.HasPrefix(vars["BC_ADDR"], "https://") || vars["BC_CA_FILE"] == "" || vars["BC_API_KEY_FILE"] == "" {
		t.Fatalf("DATA/env: %s", b)
	}
	code, out, errOut := run(t, "nodes", "list", "--json")
	var list struct {
		Nodes []struct {
			ID string `json:"id"`
		} `json:"nodes"`
	}
	nodes := &list.Nodes
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(*nodes) != 1 || (*nodes)[0].ID != e.NodeIDs[0] {
		t.Fatalf("nodes list with DATA/env: exit %d: %s %s", code, out, errOut)
	}
}
