package cli

import (
	"strconv"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/config"
)

// serve's and dev's flags take their defaults from config.Default, the
// one place the defaults are defined.
func TestFlagDefaultsComeFromConfig(t *testing.T) {
	d := config.Default()
	serve := serveCmd().Flags()
	for name, want := range map[string]string{
		"db": d.Database.DSN, "pki": d.PKI.Dir, "kek-file": d.PKI.KEKFile, "roles": strings.Join(d.Roles, ","),
		"api": d.API.Listen, "metrics": d.Metrics.Listen, "gateway": d.Gateway.Listen, "gateway-names": strings.Join(d.Gateway.Names, ","),
		"gateway-cert": d.Gateway.CertFile, "gateway-key": d.Gateway.KeyFile, "control": d.Gateway.Control, "internal": d.API.InternalListen,
		"log-level": d.LogLevel, "trusted-proxies": strings.Join(d.API.TrustedProxies, ","), "session-cookies": strconv.FormatBool(d.API.SessionCookies),
		"base-url": d.API.BaseURL, "audit-sink": d.Audit.Sink, "audit-seal-interval": d.Audit.SealInterval, "sandbox-images": d.Sandboxes.Images,
	} {
		f := serve.Lookup(name)
		if f == nil {
			t.Errorf("serve has no --%s", name)
			continue
		}
		if f.DefValue != want {
			t.Errorf("serve --%s defaults to %q, config.Default has %q", name, f.DefValue, want)
		}
	}
	dev := devCmd().Flags()
	if got := dev.Lookup("api").DefValue; got != d.API.Listen {
		t.Errorf("dev --api defaults to %q, config.Default has %q", got, d.API.Listen)
	}
	if got := dev.Lookup("gateway").DefValue; got != d.Gateway.Listen {
		t.Errorf("dev --gateway defaults to %q, config.Default has %q", got, d.Gateway.Listen)
	}
}
