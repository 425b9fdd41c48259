package gateway_test

import (
	"crypto/tls"
	"crypto/x509"
	"os/exec"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/gateway"
)

func TestNewRefusesMissingRoots(t *testing.T) {
	cert := tls.Certificate{Certificate: [][]byte{{1}}}
	cases := map[string]gateway.Config{
		"no roots":        {TrustDomain: "td", ServerCert: cert},
		"no trust domain": {NodeRoots: x509.NewCertPool(), ServerCert: cert},
		"no server cert":  {TrustDomain: "td", NodeRoots: x509.NewCertPool()},
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := gateway.New(cfg, nil, nil, nil, nil)
			if errs.CodeOf(err) != errs.InvalidConfig {
				t.Fatalf("got %v, want INVALID_CONFIG", err)
			}
		})
	}
	if _, err := gateway.New(gateway.Config{TrustDomain: "td", NodeRoots: x509.NewCertPool(), ServerCert: cert}, nil, nil, nil, nil); err != nil {
		t.Fatalf("complete config refused: %v", err)
	}
}

// The gateway relays; it must not be able to sign a command or reach the
// database directly.
func TestGatewayImportsNoKeysOrDrivers(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/bettercompute/bettercompute/internal/gateway").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list returned too little: %v", deps)
	}
	forbidden := []string{
		"database/sql",
		"github.com/bettercompute/bettercompute/internal/store",
		"github.com/bettercompute/bettercompute/internal/signing",
		"github.com/bettercompute/bettercompute/internal/nodes",
		"github.com/bettercompute/bettercompute/internal/commands",
		"modernc.org/sqlite",
		"github.com/jackc/pgx/v5",
	}
	for _, d := range deps {
		if d == "github.com/bettercompute/bettercompute/internal/commands/wire" {
			continue // signature contexts and update batch types; no keys, no SQL
		}
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("gateway depends on %s", d)
			}
		}
	}
}
