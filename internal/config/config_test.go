package config

import (
	"strings"
	"testing"
)

func TestDefaultsAreValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestParseIsStrict(t *testing.T) {
	_, err := Parse([]byte("roles = [\"api\"]\n[api]\nlisten = \"127.0.0.1:1\"\nlisen = \"x\"\n"))
	if err == nil || !strings.Contains(err.Error(), "unknown keys") || !strings.Contains(err.Error(), "lisen") {
		t.Fatalf("unknown key: %v", err)
	}
	if _, err := Parse([]byte("roles = \n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("bad TOML: %v", err)
	}
}

func TestValidateReportsEveryProblemWithItsPath(t *testing.T) {
	_, err := Parse([]byte(`roles = ["api", "web"]
log_level = "loud"
[database]
dsn = "mysql://x"
[api]
listen = "nowhere"
trusted_proxies = ["10.0.0.0/8", "proxy.example"]
session_cookies = true
[api.rate_limits]
read_per_second = 0
[audit]
seal_interval = "soon"
`))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"roles[1]", "log_level", "database.dsn", "api.listen", "api.trusted_proxies[1]", "api.base_url",
		"api.rate_limits.read_per_second", "audit.seal_interval", "8 problem(s)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q not reported in:\n%v", want, err)
		}
	}
}

func TestFileOverridesOnlyWhatItSets(t *testing.T) {
	c, err := Parse([]byte("[gateway]\nlisten = \"0.0.0.0:9000\"\n[audit]\nseal_interval = \"15m\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Gateway.Listen != "0.0.0.0:9000" || c.API.Listen != Default().API.Listen || c.SealInterval().Minutes() != 15 {
		t.Fatalf("%+v", c)
	}
}

// A gateway without the api role needs its certificate, key and the api's
// internal address, and no key-encryption key.
func TestGatewayOnlyNeedsCertAndControlNotKEK(t *testing.T) {
	t.Setenv("BC_KEK", "")
	c := Default()
	c.Roles = []string{"gateway"}
	c.PKI.KEKFile = ""
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "gateway.cert_file") || !strings.Contains(err.Error(), "gateway.control") || strings.Contains(err.Error(), "pki.kek_file") {
		t.Fatalf("gateway-only without cert or control: %v", err)
	}
	c.Gateway.CertFile, c.Gateway.KeyFile, c.Gateway.Control = "gw/gateway.crt", "gw/gateway.key", "10.0.0.5:7783"
	if err := c.Validate(); err != nil {
		t.Fatalf("complete gateway-only config: %v", err)
	}
	c.Roles = []string{"gateway", "workers"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "pki.kek_file") {
		t.Fatalf("workers without a KEK: %v", err)
	}
}

func TestMetricsListenerIsLoopbackAndApart(t *testing.T) {
	if got := Default().Metrics.Listen; got != "127.0.0.1:7782" {
		t.Fatalf("default metrics.listen %q", got)
	}
	c, err := Parse([]byte("[metrics]\nlisten = \"\"\n"))
	if err != nil || c.Metrics.Listen != "" {
		t.Fatalf("metrics off: %q %v", c.Metrics.Listen, err)
	}
	_, err = Parse([]byte("[api]\nlisten = \"127.0.0.1:9000\"\n[metrics]\nlisten = \"127.0.0.1:9000\"\n"))
	if err == nil || !strings.Contains(err.Error(), "metrics.listen: must differ from api.listen") {
		t.Fatalf("metrics on the API listener: %v", err)
	}
	_, err = Parse([]byte("[metrics]\nlisten = \"nowhere\"\n[api.rate_limits]\nfailed_auth_burst = 0\n"))
	if err == nil || !strings.Contains(err.Error(), "metrics.listen: host:port expected") || !strings.Contains(err.Error(), "api.rate_limits.failed_auth_burst: must be positive") {
		t.Fatalf("bad metrics.listen: %v", err)
	}
}

// [quotas] starts from quota.Defaults, a file overrides what it sets, and
// a limit out of range is reported with its path.
func TestQuotasSection(t *testing.T) {
	c, err := Parse([]byte("[quotas]\njoin_tokens = 50\nconcurrent_mutates = 8\n"))
	if err != nil {
		t.Fatal(err)
	}
	if l := c.QuotaLimits(); l.JoinTokens != 50 || l.Sandboxes != 100 || l.WarmMemoryMB != 8192 || l.CommandsInFlight != 20000 || c.Quotas.ConcurrentMutates != 8 {
		t.Fatalf("%+v %d", l, c.Quotas.ConcurrentMutates)
	}
	_, err = Parse([]byte("[quotas]\nsandboxes = -1\nconcurrent_mutates = 0\n"))
	for _, want := range []string{"quotas.sandboxes: 0 to 1099511627776", "quotas.concurrent_mutates: 1 to 1024"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q not reported in %v", want, err)
		}
	}
}
