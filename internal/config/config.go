// Package config reads the control plane's TOML configuration. Decoding is
// strict (an unknown key is an error), defaults are documented here, and
// Validate reports every problem at once with its field path, before
// anything starts.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	toml "github.com/pelletier/go-toml/v2"

	"github.com/bettercompute/bettercompute/internal/quota"
)

// Config is `better-compute serve`'s configuration. Every field has a
// default (see Default); a file sets only what differs.
type Config struct {
	// Roles to run: any of api, gateway, workers, lanes. Default: api,
	// gateway, workers (lanes, the bastions' tunnel end, only when named).
	Roles    []string `toml:"roles"`
	LogLevel string   `toml:"log_level"` // debug, info, warn, error; default info

	Database struct {
		DSN string `toml:"dsn"` // sqlite:PATH or postgres://…; default sqlite:better-compute.db
	} `toml:"database"`

	PKI struct {
		Dir     string `toml:"dir"`      // bundle directory; default pki
		KEKFile string `toml:"kek_file"` // 0600 key-encryption key; default kek (BC_KEK overrides)
	} `toml:"pki"`

	API struct {
		Listen         string   `toml:"listen"`          // default 127.0.0.1:7780
		TrustedProxies []string `toml:"trusted_proxies"` // addresses or CIDRs
		SessionCookies bool     `toml:"session_cookies"` // needs base_url
		BaseURL        string   `toml:"base_url"`
		// InternalListen is where the api serves the internal channel
		// gateway-only processes relay Join, Renew and Secret to (mutual
		// TLS under the internal CA); empty: none.
		InternalListen string `toml:"internal_listen"`
		// TLS of the API (see tls.go): names (DNS names or IPs) in the
		// certificate the api role issues from the internal CA (default
		// ["localhost"]; loopback always), or the operator's own cert_file
		// and key_file; plain_http only on a loopback listen or behind
		// trusted_proxies.
		Names      []string `toml:"names"`
		CertFile   string   `toml:"cert_file"`
		KeyFile    string   `toml:"key_file"`
		PlainHTTP  bool     `toml:"plain_http"`
		RateLimits struct {
			ReadPerSecond   float64 `toml:"read_per_second"`   // default 50
			ReadBurst       float64 `toml:"read_burst"`        // default 100
			MutatePerSecond float64 `toml:"mutate_per_second"` // default 10
			MutateBurst     float64 `toml:"mutate_burst"`      // default 20
			// Failed authentications per caller address.
			FailedAuthPerSecond float64 `toml:"failed_auth_per_second"` // default 1
			FailedAuthBurst     float64 `toml:"failed_auth_burst"`      // default 10
		} `toml:"rate_limits"`
	} `toml:"api"`

	Metrics struct {
		// Listen is where GET /metrics is served, never on the API
		// listener; default 127.0.0.1:7782 (loopback); "" serves none.
		Listen string `toml:"listen"`
	} `toml:"metrics"`

	// Lanes is the lanes role: the control plane's end of the bastions'
	// WireGuard tunnels. It runs with the api and gateway roles.
	Lanes struct {
		Listen    string `toml:"listen"`    // UDP ip:port the tunnel listens on; default 0.0.0.0:51820
		Advertise string `toml:"advertise"` // host:port bastions dial; default: the listen address
	} `toml:"lanes"`
	// Preview is the preview role: the proxy of sandbox preview URLs. It
	// runs with the api and gateway roles.
	Preview struct {
		Listen string `toml:"listen"` // ip:port the proxy listens on; default 127.0.0.1:7783
		// URL is the proxy's public base URL that preview URLs start
		// with; default https://<listen>.
		URL string `toml:"url"`
	} `toml:"preview"`
	Gateway struct {
		Listen string   `toml:"listen"` // default 127.0.0.1:7781
		Names  []string `toml:"names"`  // DNS names in the gateway's certificate; default ["localhost"]
		// CertFile and KeyFile are the gateway's own certificate and key
		// (from `pki issue-gateway`), and Control the api's internal_listen
		// address: a gateway without the api role needs all three and no
		// key-encryption key.
		CertFile string `toml:"cert_file"`
		KeyFile  string `toml:"key_file"`
		Control  string `toml:"control"`
	} `toml:"gateway"`

	Audit struct {
		Sink         string `toml:"sink"`          // JSON-lines path or bucket URL; empty: none
		SealInterval string `toml:"seal_interval"` // Go duration; default 1h
	} `toml:"audit"`

	Sandboxes struct {
		Images string `toml:"images"` // gocloud.dev/blob URL of the image store; empty: no imports
		// MaxImageBytes bounds an uploaded image's tar; default and
		// ceiling 2 GiB (what a node accepts).
		MaxImageBytes int64 `toml:"max_image_bytes"`
	} `toml:"sandboxes"`

	// Quotas are every tenant's default limits (a root operator sets one
	// tenant's with tenants.setQuotas); the root tenant is not limited.
	// See docs/operations.md.
	Quotas struct {
		JoinTokens        int64 `toml:"join_tokens"`        // outstanding (unused, unexpired) join tokens; default 10000
		Sandboxes         int64 `toml:"sandboxes"`          // live sandboxes; default 100
		WarmMemoryMB      int64 `toml:"warm_memory_mb"`     // warm-pool memory, sum of warm × memory_mb; default 8192
		CommandsInFlight  int64 `toml:"commands_in_flight"` // queued, sent or running commands; default 20000
		ConcurrentMutates int   `toml:"concurrent_mutates"` // mutating API calls running at once per tenant; default 4
	} `toml:"quotas"`
}

// The roles a process can run: the values of roles.
const (
	RoleAPI     = "api"
	RoleGateway = "gateway"
	RoleWorkers = "workers"
	RoleLanes   = "lanes"
	RolePreview = "preview"
)

// Default returns the documented defaults.
func Default() Config {
	var c Config
	c.Roles = []string{RoleAPI, RoleGateway, RoleWorkers}
	c.LogLevel = "info"
	c.Database.DSN = "sqlite:better-compute.db"
	c.PKI.Dir, c.PKI.KEKFile = "pki", "kek"
	c.API.Listen = "127.0.0.1:7780"
	c.Lanes.Listen = "0.0.0.0:51820"
	c.Preview.Listen = "127.0.0.1:7783"
	c.API.Names = []string{"localhost"}
	// The same as api.DefaultRateLimits (config sits below the transports
	// and does not import api; server's TestFromConfigOfTheDefaults keeps
	// the two equal).
	c.API.RateLimits.ReadPerSecond, c.API.RateLimits.ReadBurst = 50, 100
	c.API.RateLimits.MutatePerSecond, c.API.RateLimits.MutateBurst = 10, 20
	c.API.RateLimits.FailedAuthPerSecond, c.API.RateLimits.FailedAuthBurst = 1, 10
	c.Metrics.Listen = "127.0.0.1:7782"
	c.Gateway.Listen = "127.0.0.1:7781"
	c.Gateway.Names = []string{"localhost"}
	c.Audit.SealInterval = "1h"
	q := quota.Defaults()
	c.Quotas.JoinTokens, c.Quotas.Sandboxes, c.Quotas.WarmMemoryMB, c.Quotas.CommandsInFlight = q.JoinTokens, q.Sandboxes, q.WarmMemoryMB, q.CommandsInFlight
	c.Quotas.ConcurrentMutates = DefaultConcurrentMutates
	return c
}

// DefaultConcurrentMutates is quotas.concurrent_mutates's default.
const DefaultConcurrentMutates = 4

// QuotaLimits returns the [quotas] limits.
func (c Config) QuotaLimits() quota.Limits {
	return quota.Limits{JoinTokens: c.Quotas.JoinTokens, Sandboxes: c.Quotas.Sandboxes, WarmMemoryMB: c.Quotas.WarmMemoryMB, CommandsInFlight: c.Quotas.CommandsInFlight}
}

// Load reads path over the defaults, strictly, and validates the result.
func Load(path string) (Config, error) {
	c, err := Read(path)
	if err != nil {
		return Config{}, err
	}
	return c, c.Validate()
}

// Read reads path over the defaults, strictly, without validating (for a
// caller that overrides fields before it validates).
func Read(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return decode(b)
}

// Parse decodes TOML over the defaults, strictly, and validates.
func Parse(b []byte) (Config, error) {
	c, err := decode(b)
	if err != nil {
		return Config{}, err
	}
	return c, c.Validate()
}

func decode(b []byte) (Config, error) {
	c := Default()
	dec := toml.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		var strict *toml.StrictMissingError
		if errors.As(err, &strict) {
			return Config{}, fmt.Errorf("config: unknown keys:\n%s", strict.String())
		}
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return Config{}, fmt.Errorf("config: line %d, column %d: %s", row, col, de.Error())
		}
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return c, nil
}

// SealInterval returns audit.seal_interval parsed (Validate checked it).
func (c Config) SealInterval() time.Duration {
	d, _ := time.ParseDuration(c.Audit.SealInterval)
	return d
}

// Keyed reports whether the roles hold keys (api or workers) and so need
// the sealed PKI bundle and the key-encryption key; a gateway-only process
// needs neither.
func (c Config) Keyed() bool {
	return slices.Contains(c.Roles, RoleAPI) || slices.Contains(c.Roles, RoleWorkers)
}

// Validate reports every problem at once, each with its field path.
func (c Config) Validate() error {
	var p problems
	c.validateProcess(&p)
	c.validateListeners(&p)
	c.validateAPI(&p)
	c.validateAPITLS(&p)
	for _, q := range c.QuotaLimits().Validate() {
		p = append(p, "quotas."+q)
	}
	if c.Quotas.ConcurrentMutates < 1 || c.Quotas.ConcurrentMutates > 1024 {
		p.add("quotas.concurrent_mutates", "1 to 1024")
	}
	if d, err := time.ParseDuration(c.Audit.SealInterval); err != nil || d < time.Second {
		p.add("audit.seal_interval", "a duration of at least 1s, such as 1h")
	}
	if len(p) == 0 {
		return nil
	}
	slices.Sort(p)
	return fmt.Errorf("config: %d problem(s):\n  %s", len(p), strings.Join(p, "\n  "))
}

// problems collects Validate's findings, each "path: message".
type problems []string

func (p *problems) add(path, msg string) { *p = append(*p, path+": "+msg) }

// addr adds a finding at path unless a is host:port.
func (p *problems) addr(path, a string) {
	if _, _, err := net.SplitHostPort(a); err != nil {
		p.add(path, "host:port expected")
	}
}

// validateProcess checks the roles, log level, database and PKI.
func (c Config) validateProcess(p *problems) {
	if len(c.Roles) == 0 {
		p.add("roles", "at least one of api, gateway, workers, lanes, preview")
	}
	for i, r := range c.Roles {
		if !slices.Contains([]string{RoleAPI, RoleGateway, RoleWorkers, RoleLanes, RolePreview}, r) {
			p.add(fmt.Sprintf("roles[%d]", i), fmt.Sprintf("%q is not api, gateway, workers, lanes or preview", r))
		}
	}
	if slices.Contains(c.Roles, RolePreview) && (!slices.Contains(c.Roles, RoleAPI) || !slices.Contains(c.Roles, RoleGateway)) {
		p.add("roles", "preview runs in a process with the api and gateway roles")
	}
	if slices.Contains(c.Roles, RoleLanes) && (!slices.Contains(c.Roles, RoleAPI) || !slices.Contains(c.Roles, RoleGateway)) {
		p.add("roles", "lanes runs in a process with the api and gateway roles")
	}
	if slices.Contains(c.Roles, RoleLanes) {
		if _, err := netip.ParseAddrPort(c.Lanes.Listen); err != nil {
			p.add("lanes.listen", "ip:port expected, such as 0.0.0.0:51820")
		}
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		p.add("log_level", "debug, info, warn or error")
	}
	if !strings.HasPrefix(c.Database.DSN, "sqlite:") && !strings.HasPrefix(c.Database.DSN, "postgres://") && !strings.HasPrefix(c.Database.DSN, "postgresql://") {
		p.add("database.dsn", "must start with sqlite: or postgres://")
	}
	if c.PKI.Dir == "" {
		p.add("pki.dir", "required")
	}
	if c.Keyed() && c.PKI.KEKFile == "" && os.Getenv("BC_KEK") == "" {
		p.add("pki.kek_file", "required (or set BC_KEK)")
	}
}

// validateListeners checks the addresses the roles listen on and dial.
func (c Config) validateListeners(p *problems) {
	hasAPI, hasGateway := slices.Contains(c.Roles, RoleAPI), slices.Contains(c.Roles, RoleGateway)
	if hasAPI {
		p.addr("api.listen", c.API.Listen)
	}
	if hasGateway && !hasAPI {
		if c.Gateway.CertFile == "" || c.Gateway.KeyFile == "" {
			p.add("gateway.cert_file", "a gateway without the api role needs cert_file and key_file (pki issue-gateway)")
		}
		p.addr("gateway.control", c.Gateway.Control)
	}
	if c.API.InternalListen != "" {
		p.addr("api.internal_listen", c.API.InternalListen)
	}
	if c.Metrics.Listen != "" {
		p.addr("metrics.listen", c.Metrics.Listen)
		if c.API.Listen == c.Metrics.Listen && hasAPI {
			p.add("metrics.listen", "must differ from api.listen: metrics are never served on the API listener")
		}
	}
	if hasGateway {
		p.addr("gateway.listen", c.Gateway.Listen)
		if len(c.Gateway.Names) == 0 {
			p.add("gateway.names", "at least one DNS name")
		}
	}
}

// validateAPI checks the API envelope's settings.
func (c Config) validateAPI(p *problems) {
	for i, tp := range c.API.TrustedProxies {
		if _, err := netip.ParsePrefix(tp); err != nil {
			if _, err := netip.ParseAddr(tp); err != nil {
				p.add(fmt.Sprintf("api.trusted_proxies[%d]", i), "not an address or CIDR")
			}
		}
	}
	if c.API.SessionCookies && c.API.BaseURL == "" {
		p.add("api.base_url", "required when api.session_cookies is true")
	}
	rl := c.API.RateLimits
	for path, v := range map[string]float64{"api.rate_limits.read_per_second": rl.ReadPerSecond, "api.rate_limits.read_burst": rl.ReadBurst,
		"api.rate_limits.mutate_per_second": rl.MutatePerSecond, "api.rate_limits.mutate_burst": rl.MutateBurst,
		"api.rate_limits.failed_auth_per_second": rl.FailedAuthPerSecond, "api.rate_limits.failed_auth_burst": rl.FailedAuthBurst} {
		if v <= 0 {
			p.add(path, "must be positive")
		}
	}
}
