package server

import (
	"crypto"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/config"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/quota"
)

// FromConfig is the one mapping from `serve`'s TOML configuration to
// Options. It sets every field the configuration decides; the caller adds
// what is loaded from files or opened (DB, Bundle, KEK, GatewayCert,
// AuditSink) and Log.
func FromConfig(c config.Config) (Options, error) {
	proxies, err := api.ParseProxies(c.API.TrustedProxies)
	if err != nil {
		return Options{}, fmt.Errorf("api.trusted_proxies: %w", err)
	}
	rl := c.API.RateLimits
	return Options{
		Roles: c.Roles, Clock: clock.Real{},
		APIListen: c.API.Listen, MetricsListen: c.Metrics.Listen, GatewayListen: c.Gateway.Listen, GatewayNames: c.Gateway.Names,
		InternalListen: c.API.InternalListen, Control: c.Gateway.Control,
		TrustedProxies: proxies, SessionCookies: c.API.SessionCookies, BaseURL: c.API.BaseURL,
		RateLimits: api.RateLimits{ReadPerSecond: rl.ReadPerSecond, ReadBurst: rl.ReadBurst, MutatePerSecond: rl.MutatePerSecond, MutateBurst: rl.MutateBurst,
			FailedAuthPerSecond: rl.FailedAuthPerSecond, FailedAuthBurst: rl.FailedAuthBurst},
		Quotas: c.QuotaLimits(), TenantMutates: c.Quotas.ConcurrentMutates,
		AuditSealInterval: c.SealInterval(), AuditSinkName: c.Audit.Sink,
		SandboxImages: c.Sandboxes.Images, SandboxMaxImageBytes: c.Sandboxes.MaxImageBytes,
		APINames: c.API.Names, APIPlainHTTP: c.API.PlainHTTP,
		LanesListen: c.Lanes.Listen, LanesAdvertise: c.Lanes.Advertise,
		PreviewListen: c.Preview.Listen, PreviewURL: c.Preview.URL,
	}, nil
}

// roles are the roles one process runs.
type roles struct{ api, gateway, workers, lanes, preview bool }

// keyed reports whether the roles hold keys (api or workers).
func (r roles) keyed() bool { return r.api || r.workers }

// withDefaults checks o and fills in the defaults of the fields left zero.
// Which process holds which key: the api role the node CA, join and
// internal CA keys and the KEK (secrets, idempotency); the workers role the
// command-signing root, the audit key and the KEK; a gateway without the
// api role none (its own TLS key only), relaying what needs one over the
// internal channel.
func (o Options) withDefaults() (Options, roles, error) {
	if o.DB == nil || o.Bundle == nil {
		return o, roles{}, errs.New(errs.InvalidConfig, "a database and a PKI bundle are required")
	}
	if len(o.Roles) == 0 {
		o.Roles = config.Default().Roles
	}
	for _, r := range o.Roles {
		if r != RoleAPI && r != RoleGateway && r != RoleWorkers && r != RoleLanes && r != RolePreview {
			return o, roles{}, errs.New(errs.InvalidConfig, "roles must be api, gateway, workers, lanes or preview")
		}
	}
	r := roles{api: slices.Contains(o.Roles, RoleAPI), gateway: slices.Contains(o.Roles, RoleGateway), workers: slices.Contains(o.Roles, RoleWorkers),
		lanes: slices.Contains(o.Roles, RoleLanes), preview: slices.Contains(o.Roles, RolePreview)}
	switch {
	case r.preview && (!r.api || !r.gateway):
		return o, r, errs.New(errs.InvalidConfig, "the preview role runs in a process with the api and gateway roles")
	case r.lanes && (!r.api || !r.gateway):
		return o, r, errs.New(errs.InvalidConfig, "the lanes role runs in a process with the api and gateway roles")
	case r.lanes && o.LanesListen == "":
		return o, r, errs.New(errs.InvalidConfig, "the lanes role needs its UDP listen address (lanes.listen)")
	case r.keyed() && (o.Bundle.Public() || o.KEK == (pki.KEK{})):
		return o, r, errs.New(errs.InvalidConfig, "the api and workers roles need the sealed PKI bundle and the key-encryption key")
	case !r.keyed() && o.KEK != (pki.KEK{}):
		return o, r, errs.New(errs.InvalidConfig, "a gateway-only process takes no key-encryption key")
	case r.gateway && !r.api && (o.GatewayCert == nil || o.Control == ""):
		return o, r, errs.New(errs.InvalidConfig, "a gateway without the api role needs its certificate (pki issue-gateway) and the api's internal address")
	}
	if r.api {
		if err := checkAPITLS(o); err != nil {
			return o, r, err
		}
	}
	if len(o.APINames) == 0 {
		o.APINames = config.Default().API.Names
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if len(o.GatewayNames) == 0 {
		o.GatewayNames = config.Default().Gateway.Names
	}
	if o.Quotas == (quota.Limits{}) {
		o.Quotas = quota.Defaults()
	}
	if o.AuditSinkName == "" {
		o.AuditSinkName = "default"
	}
	if o.ShutdownGrace <= 0 {
		o.ShutdownGrace = DefaultShutdownGrace
	}
	return o, r, nil
}

// keys are the private keys and signed material the roles of this process
// unsealed from the bundle; each is zero in a process whose roles do not
// use it.
type keys struct {
	nodeCA                crypto.Signer       // api: issues node certificates
	bundleBody, bundleSig []byte              // api: the trust bundle and its signature by the join key
	bundleOthers          []pki.JoinSignature // api: its signatures by the staged and previous join keys
	commandRoot           ed25519.PrivateKey
	internal              crypto.Signer      // api, when it issues the gateway's or the internal channel's certificate
	breakGlass            ed25519.PrivateKey // api: the break-glass SSH CA (nil when the bundle has none)
}

// unseal unseals the keys r's roles use, and nothing more.
func unseal(o Options, r roles, now time.Time) (keys, error) {
	var k keys
	b := o.Bundle
	if r.api {
		nodeCAKey, err := b.NodeCAKey(o.KEK)
		if err != nil {
			return k, errs.Wrap(errs.InvalidConfig, "the node CA key does not unseal with this key-encryption key", err)
		}
		joinKeys, err := b.JoinSigningKeys(o.KEK)
		if err != nil {
			return k, errs.Wrap(errs.InvalidConfig, "the join key does not unseal with this key-encryption key", err)
		}
		tbBody, err := pki.EncodeTrustBundle(b.TrustBundle(now))
		if err != nil {
			return k, fmt.Errorf("server: encode trust bundle: %w", err)
		}
		k.nodeCA, k.bundleBody, k.bundleSig = nodeCAKey, tbBody, pki.SignTrustBundle(joinKeys[0], tbBody)
		if b.BreakGlassCA != nil {
			if k.breakGlass, err = b.BreakGlassCAKey(o.KEK); err != nil {
				return k, errs.Wrap(errs.InvalidConfig, "the break-glass SSH CA key does not unseal", err)
			}
		}
		for _, jk := range joinKeys[1:] {
			k.bundleOthers = append(k.bundleOthers, pki.JoinSignature{Key: jk.Public().(ed25519.PublicKey), Sig: pki.SignTrustBundle(jk, tbBody)})
		}
	}
	if r.workers {
		rootKey, err := b.CommandRootKey(o.KEK)
		if err != nil {
			return k, errs.Wrap(errs.InvalidConfig, "the command-signing root key does not unseal", err)
		}
		k.commandRoot = rootKey
	}
	if r.api && (r.gateway && o.GatewayCert == nil || o.InternalListen != "" || issuesAPICert(o)) {
		internalKey, err := b.InternalCAKey(o.KEK)
		if err != nil {
			return k, errs.Wrap(errs.InvalidConfig, "the internal CA key does not unseal", err)
		}
		k.internal = internalKey
	}
	return k, nil
}
