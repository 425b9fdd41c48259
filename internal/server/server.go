// Package server wires the modules to their transports and runs the
// control plane's roles (api, gateway, workers) in one process or many.
// All state lives in the database, so any role can be replicated.
package server

import (
	"context"
	"crypto/tls"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/breakglass"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/config"
	"github.com/bettercompute/bettercompute/internal/gateway"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/idempotency"
	"github.com/bettercompute/bettercompute/internal/lanes"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/quorum"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/revocations"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previews"
	"github.com/bettercompute/bettercompute/internal/secrets"
	"github.com/bettercompute/bettercompute/internal/signing"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/tickets"
	"github.com/bettercompute/bettercompute/internal/tunnels"
)

// Roles a process can run.
const (
	RoleAPI     = config.RoleAPI
	RoleGateway = config.RoleGateway
	RoleWorkers = config.RoleWorkers
	RoleLanes   = config.RoleLanes
	RolePreview = config.RolePreview
)

// Options configure a control plane process.
type Options struct {
	DB     *store.DB
	Bundle *pki.Bundle
	KEK    pki.KEK
	Roles  []string // default: all three
	// APIListen and GatewayListen are host:port; port 0 picks one.
	APIListen, GatewayListen string
	// MetricsListen is host:port of the Prometheus /metrics listener, apart
	// from the API (the metrics name methods and counts of every tenant,
	// so they are never served on the API listener); "" serves none.
	MetricsListen string
	// GatewayNames are the DNS names in the gateway's TLS certificate
	// (default localhost); loopback IPs are always included. They apply
	// when the process issues that certificate itself (with the api role).
	GatewayNames []string
	// GatewayCert is the gateway's own certificate and key (from `pki
	// issue-gateway`): its node-facing server certificate and its client
	// certificate on the internal channel. A gateway without the api role
	// needs it, and Control; it then holds no other key, and Bundle may be
	// the bundle's public half (pki.LoadPublic) and KEK zero.
	GatewayCert *tls.Certificate
	// Control is the host:port of the api role's internal channel, which a
	// gateway without the api role relays Join, Renew, Secret and the
	// signed trust bundle to.
	Control string
	// APICert, when set, is the public API's TLS certificate (api.cert_file
	// and api.key_file); otherwise the api role issues its own from the
	// internal CA for APINames (DNS names or IPs; default localhost) and
	// loopback, renewed as it ages. APIPlainHTTP serves plain HTTP
	// instead: refused (INVALID_CONFIG) unless APIListen is loopback or
	// TrustedProxies is set, and then only those proxies are answered.
	APICert      *tls.Certificate
	APINames     []string
	APIPlainHTTP bool
	// LanesListen is the UDP ip:port of the lanes role's tunnel
	// ("127.0.0.1:0" in dev); LanesAdvertise the host:port bastions dial
	// (default: LanesListen with the port picked).
	LanesListen, LanesAdvertise string
	// PreviewListen is the preview role's ip:port ("127.0.0.1:0" when
	// empty); PreviewURL the public base URL of preview URLs (default:
	// https://, or http:// with APIPlainHTTP, and the address listened
	// on). The proxy serves TLS with the API's certificate.
	PreviewListen, PreviewURL string
	// InternalListen, with the api role, is the host:port of the internal
	// channel gateway processes relay to ("" serves none).
	InternalListen string
	Clock          clock.Clock
	Log            *slog.Logger
	// RevocationPoll is how often a gateway reads revocations (default 1s).
	RevocationPoll time.Duration
	// CommandPoll is how often a gateway sweeps for commands signed in
	// another process (default 250ms; PostgreSQL NOTIFY pokes it sooner).
	CommandPoll time.Duration
	// NodeCertLifetime is the lifetime of node certificates (default 24h).
	NodeCertLifetime time.Duration
	// RenewInterval is the least time between two renewals of one node
	// (default nodes.DefaultRenewInterval).
	RenewInterval time.Duration
	// SessionHeartbeat is how often a gateway refreshes its sessions'
	// heartbeat in the registry (default nodes.SessionHeartbeat).
	SessionHeartbeat time.Duration
	// API envelope settings: trusted proxies, session cookies and their
	// base URL, and rate limits (zero: api.DefaultRateLimits).
	TrustedProxies api.Proxies
	SessionCookies bool
	BaseURL        string
	RateLimits     api.RateLimits
	// Quotas are every tenant's default limits (zero: quota.Defaults);
	// TenantMutates bounds one tenant's mutating API calls running at once
	// (zero: api.DefaultTenantMutates).
	Quotas        quota.Limits
	TenantMutates int
	// AuditSealInterval is how often the workers role seals the audit log
	// (default 1h); AuditSink, when set, receives a copy of every sealed
	// audit row, its cursor kept under AuditSinkName (default "default").
	AuditSealInterval time.Duration
	AuditSink         auditlog.Sink
	AuditSinkName     string
	// SandboxImages is the gocloud.dev/blob URL of the sandbox image store
	// (file:///dir by default in dev); "" disables image imports.
	SandboxImages string
	// SandboxMaxImageBytes bounds an uploaded image (0: the 2 GiB a node
	// accepts, also the ceiling).
	SandboxMaxImageBytes int64
	// ShutdownGrace bounds how long Close lets the listeners finish the
	// calls in flight (gRPC GracefulStop, http.Server.Shutdown) before it
	// stops them (default DefaultShutdownGrace).
	ShutdownGrace time.Duration
}

// DefaultShutdownGrace is Options.ShutdownGrace's default.
const DefaultShutdownGrace = 5 * time.Second

// ControlPlane is a running control plane process.
type ControlPlane struct {
	DB       *store.DB
	Bus      *bus.Bus
	Events   *audit.Events
	Nodes    *nodes.Service
	Commands *commands.Service
	APIKeys  *apikeys.Service
	IAM      *iam.Service
	Secrets  *secrets.Service
	// Sandboxes is the sandbox module (package sandboxes).
	Sandboxes *sandboxes.Service
	// BreakGlass is the break-glass SSH module (api role only).
	BreakGlass *breakglass.Service
	// Quotas are the per-tenant limits the modules admit rows against.
	Quotas  *quota.Service
	Signer  *signing.Signer
	Metrics *prometheus.Registry
	Gateway *gateway.Gateway
	Quorum  *quorum.Service
	// Tunnels is the tunnels module (api role only).
	Tunnels *tunnels.Service
	// Revocations is the revocation feed (internal/revocations).
	Revocations *revocations.Feed
	// Bastions is the bastions module (every role: the gateway and the
	// lanes role call its Hello, SignedGrants, Peers, LanesKey and
	// RecordLaneEvents; its private keys open only where the KEK is).
	Bastions *bastions.Service
	// Lanes is the lanes role (nil when this process does not run it).
	Lanes *lanes.Role
	// Previews is the previews module (api role only): sandboxes.preview
	// and the preview key.
	Previews *previews.Service
	// PreviewAddr is the host:port the preview role listens on ("" without
	// it).
	PreviewAddr string
	// ticketVerifier checks tunnel tickets (api and gateway).
	ticketVerifier *tickets.Verifier
	// intentSigner signs nodes' desired states for the gateway (the
	// workers' signer, else the api's ticket signer; nil in a
	// gateway-only process, which then sends none).
	intentSigner *signing.Signer
	// API is the public API's envelope and method table (api role only).
	API *api.Server
	// access is the api's cache of authentications and allowed read
	// decisions (wireAccess).
	access *api.AccessCache
	// pokes tells whether pokes from other processes arrive (nil on
	// SQLite, where there are none; bridgePokes).
	pokes *pokeLiveness
	// Audit is the audit log's sealing job (workers role only).
	Audit *auditlog.Worker

	APIAddr     string // host:port the API listens on ("" without the api role)
	MetricsAddr string // host:port /metrics listens on ("" without MetricsListen)
	GatewayAddr string // host:port the gateway listens on
	// InternalAddr is the host:port of the internal channel ("" unless the
	// api role serves one).
	InternalAddr string

	// ctx is the roles' context: it ends with Close or when a role fails.
	ctx    context.Context
	cancel context.CancelFunc
	group  *errgroup.Group
	grace  time.Duration
	// closers release what the roles used (image store, internal channel
	// connection), after every role has returned.
	closers   []func()
	closeOnce sync.Once
	err       error
}

// Start builds the modules and starts the requested roles. It refuses
// (INVALID_CONFIG) a configuration it cannot run safely.
func Start(ctx context.Context, o Options) (*ControlPlane, error) {
	o, r, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	now := o.Clock.Now()
	k, err := unseal(o, r, now)
	if err != nil {
		return nil, err
	}
	cp := newControlPlane(ctx, o.ShutdownGrace)
	cp.DB = o.DB
	if err := cp.start(o, r, k, now); err != nil {
		cp.Close()
		return nil, err
	}
	return cp, nil
}

// newControlPlane returns a control plane with no module and no role yet,
// whose roles run until Close (not until ctx ends: ctx bounds the start).
func newControlPlane(ctx context.Context, grace time.Duration) *ControlPlane {
	cp := &ControlPlane{Bus: bus.New(), Metrics: prometheus.NewRegistry(), grace: grace}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cp.cancel = cancel
	cp.group, cp.ctx = errgroup.WithContext(rctx)
	return cp
}

// start builds the modules, then starts each role of r in the group.
func (cp *ControlPlane) start(o Options, r roles, k keys, now time.Time) error {
	if err := cp.buildModules(o, r, k); err != nil {
		return err
	}
	cp.wireAccess(o)
	cp.bridgePokes(o)
	if r.workers {
		if err := cp.startWorkers(o); err != nil {
			return err
		}
	}
	local := gatewayServices{n: cp.Nodes, sec: cp.Secrets, q: cp.Quorum, db: o.DB, sbx: cp.Sandboxes}
	if k.internal != nil && o.InternalListen != "" {
		if err := cp.serveInternal(o, local, k.internal, now); err != nil {
			return err
		}
	}
	if r.lanes {
		if err := cp.startLanes(o); err != nil {
			return err
		}
	}
	if r.gateway {
		if err := cp.startGateway(o, r, k, local, now); err != nil {
			return err
		}
	}
	if r.preview {
		if err := cp.startPreview(o, k, now); err != nil {
			return err
		}
	}
	if r.api {
		if err := cp.startAPI(o, k, now); err != nil {
			return err
		}
	}
	if o.MetricsListen != "" {
		return cp.serveMetrics(o)
	}
	return nil
}

// Done is closed when the roles stop: after Close, or as soon as one role
// fails (then Close returns and Err says why).
func (cp *ControlPlane) Done() <-chan struct{} { return cp.ctx.Done() }

// Close stops every role, gracefully within Options.ShutdownGrace, and
// waits for them. It is idempotent.
func (cp *ControlPlane) Close() {
	cp.closeOnce.Do(func() {
		cp.cancel()
		cp.err = cp.group.Wait()
		for i := len(cp.closers) - 1; i >= 0; i-- {
			cp.closers[i]()
		}
	})
}

// Err closes the control plane (see Close) and returns the first error a
// role failed with: nil when every role stopped because Close asked.
func (cp *ControlPlane) Err() error {
	cp.Close()
	return cp.err
}

// IdempotencyKey is the key of the stored idempotency digests, derived
// from the key-encryption key.
func IdempotencyKey(kek pki.KEK) []byte {
	return idempotency.DeriveKey(kek[:])
}
