// Package server wires the modules to their transports and runs the
// control plane's roles (api, gateway, workers) in one process or many.
// All state lives in the database, so any role can be replicated.
package server

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/gateway"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/internalv1"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/quorum"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/secrets"
	"github.com/bettercompute/bettercompute/internal/signing"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Roles a process can run.
const (
	RoleAPI     = "api"
	RoleGateway = "gateway"
	RoleWorkers = "workers"
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
}

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
	// Quotas are the per-tenant limits the modules admit rows against.
	Quotas  *quota.Service
	Signer  *signing.Signer
	Metrics *prometheus.Registry
	Gateway *gateway.Gateway
	Quorum  *quorum.Service
	// API is the public API's envelope and method table (api role only).
	API *api.Server
	// Audit is the audit log's sealing job (workers role only).
	Audit *auditlog.Worker

	APIAddr     string // host:port the API listens on ("" without the api role)
	MetricsAddr string // host:port /metrics listens on ("" without MetricsListen)
	GatewayAddr string // host:port the gateway listens on
	// InternalAddr is the host:port of the internal channel ("" unless the
	// api role serves one).
	InternalAddr string

	cancel  context.CancelFunc
	wg      sync.WaitGroup
	closers []func()
}

// Start builds the modules and starts the requested roles. It refuses
// (INVALID_CONFIG) a configuration it cannot run safely.
func Start(ctx context.Context, o Options) (*ControlPlane, error) {
	if o.DB == nil || o.Bundle == nil {
		return nil, errs.New(errs.InvalidConfig, "a database and a PKI bundle are required")
	}
	if len(o.Roles) == 0 {
		o.Roles = []string{RoleAPI, RoleGateway, RoleWorkers}
	}
	for _, r := range o.Roles {
		if r != RoleAPI && r != RoleGateway && r != RoleWorkers {
			return nil, errs.New(errs.InvalidConfig, "roles must be api, gateway or workers")
		}
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	now := o.Clock.Now()
	b := o.Bundle
	hasAPI, hasWorkers, hasGateway := slices.Contains(o.Roles, RoleAPI), slices.Contains(o.Roles, RoleWorkers), slices.Contains(o.Roles, RoleGateway)
	// Which process holds which key: the api role the node CA, join and
	// internal CA keys and the KEK (secrets, idempotency); the workers role
	// the command-signing root, the audit key and the KEK; a gateway
	// without the api role none (its own TLS key only), relaying what
	// needs one over the internal channel.
	keyed := hasAPI || hasWorkers
	switch {
	case keyed && (b.Public() || o.KEK == (pki.KEK{})):
		return nil, errs.New(errs.InvalidConfig, "the api and workers roles need the sealed PKI bundle and the key-encryption key")
	case !keyed && o.KEK != (pki.KEK{}):
		return nil, errs.New(errs.InvalidConfig, "a gateway-only process takes no key-encryption key")
	case hasGateway && !hasAPI && (o.GatewayCert == nil || o.Control == ""):
		return nil, errs.New(errs.InvalidConfig, "a gateway without the api role needs its certificate (pki issue-gateway) and the api's internal address")
	}
	cp := &ControlPlane{DB: o.DB, Bus: bus.New(), Metrics: prometheus.NewRegistry()}
	cp.Events = audit.NewEvents(o.DB, o.Clock)

	ncfg := nodes.Config{TrustDomain: b.TrustDomain, NodeCA: b.NodeCA, CertLifetime: o.NodeCertLifetime, RenewInterval: o.RenewInterval, JoinPublicKey: b.JoinKey}
	if hasAPI {
		nodeCAKey, err := b.NodeCAKey(o.KEK)
		if err != nil {
			return nil, errs.Wrap(errs.InvalidConfig, "the node CA key does not unseal with this key-encryption key", err)
		}
		joinKey, err := b.JoinSigningKey(o.KEK)
		if err != nil {
			return nil, errs.Wrap(errs.InvalidConfig, "the join key does not unseal with this key-encryption key", err)
		}
		tbBody, err := pki.EncodeTrustBundle(b.TrustBundle(now))
		if err != nil {
			return nil, fmt.Errorf("server: encode trust bundle: %w", err)
		}
		ncfg.NodeCAKey, ncfg.BundleBody, ncfg.BundleSig = nodeCAKey, tbBody, pki.SignTrustBundle(joinKey, tbBody)
	}
	ncfg.JoinPin = pki.JoinKeyPin(b.JoinKey)
	if o.Quotas == (quota.Limits{}) {
		o.Quotas = quota.Defaults()
	}
	cp.Quotas = quota.New(o.DB, o.Clock, o.Quotas)
	cp.Nodes = nodes.New(o.DB, o.Clock, cp.Events, cp.Bus, o.Log, cp.Quotas, ncfg)
	var err error
	if cp.Quorum, err = quorum.New(o.DB, o.Clock, cp.Bus, cp.Nodes, b.Deployment, b.TrustBundle(now).Approvers, b.Threshold, o.Log); err != nil {
		return nil, err
	}
	cp.Commands = commands.New(commands.Deps{Store: commands.NewStore(o.DB), Clock: o.Clock, Bus: cp.Bus, Nodes: cp.Nodes, Batches: cp.Quorum,
		Quotas: cp.Quotas, Secrets: secretRefs{cp}, Log: o.Log})
	cp.APIKeys = apikeys.New(o.DB, o.Clock)
	cp.IAM = iam.New(o.DB, o.Clock)
	if hasAPI {
		cp.Secrets = secrets.New(o.DB, o.Clock, o.KEK, cp.IAM, cp.Nodes, cp.Commands.Store(), cp.Events, o.Log)
	}

	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cp.cancel = cancel
	fail := func(err error) (*ControlPlane, error) {
		cp.Close()
		return nil, err
	}
	if err := cp.startSandboxes(rctx, o); err != nil {
		return fail(err)
	}

	bridgePokes(rctx, o.DB, cp.Bus, o.Log)

	if hasWorkers {
		rootKey, err := b.CommandRootKey(o.KEK)
		if err != nil {
			return fail(errs.Wrap(errs.InvalidConfig, "the command-signing root key does not unseal", err))
		}
		cp.Signer = signing.New(signing.Deps{DB: o.DB, Commands: cp.Commands.Store(), Clock: o.Clock, KEK: o.KEK, Root: b.CommandRoot, RootKey: rootKey,
			TrustDomain: b.TrustDomain, Bus: cp.Bus, Batches: cp.Quorum, Log: o.Log})
		cp.wg.Add(2)
		go func() { defer cp.wg.Done(); cp.Signer.Run(rctx, time.Second) }()
		go func() { defer cp.wg.Done(); cp.sweep(rctx, o.Clock, o.Log) }()
		if err := cp.startAudit(rctx, o); err != nil {
			return fail(err)
		}
		cp.wg.Add(1)
		go func() { defer cp.wg.Done(); cp.Sandboxes.Run(rctx, 2*time.Second) }()
	}

	local := gatewayServices{n: cp.Nodes, sec: cp.Secrets, q: cp.Quorum, db: o.DB, sbx: cp.Sandboxes}
	var internalKey crypto.Signer
	if hasAPI && (hasGateway && o.GatewayCert == nil || o.InternalListen != "") {
		k, err := b.InternalCAKey(o.KEK)
		if err != nil {
			return fail(errs.Wrap(errs.InvalidConfig, "the internal CA key does not unseal", err))
		}
		internalKey = k
		if o.InternalListen != "" {
			if err := cp.serveInternal(o, local, internalKey, now); err != nil {
				return fail(err)
			}
		}
	}

	if hasGateway {
		var serverCert tls.Certificate
		if o.GatewayCert != nil {
			serverCert = *o.GatewayCert
		} else {
			names := o.GatewayNames
			if len(names) == 0 {
				names = []string{"localhost"}
			}
			c, err := pki.IssueServerCert(b.InternalCA, internalKey, b.TrustDomain, names,
				[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, 7*24*time.Hour, now)
			if err != nil {
				return fail(fmt.Errorf("server: gateway certificate: %w", err))
			}
			serverCert = c
		}
		var svc gateway.Services = local
		if !hasAPI {
			conn, err := dialControl(o.Control, serverCert, b, o.Clock)
			if err != nil {
				return fail(errs.Wrap(errs.InvalidConfig, "the internal channel address is not usable", err))
			}
			cp.closers = append(cp.closers, func() { _ = conn.Close() })
			svc = &relayServices{local: local, client: internalv1.NewGatewayServicesClient(conn), clk: o.Clock}
		}
		roots, err := b.TrustBundle(now).NodeRootPool()
		if err != nil {
			return fail(fmt.Errorf("server: node roots: %w", err))
		}
		lis, err := net.Listen("tcp", orDefault(o.GatewayListen, "127.0.0.1:0"))
		if err != nil {
			return fail(errs.Wrap(errs.InvalidConfig, "the gateway cannot listen on its address", err))
		}
		cp.GatewayAddr = lis.Addr().String()
		// A gateway's id is stable across restarts on the same host and
		// address, so a restarted gateway closes the sessions its previous
		// run left open in the registry.
		host, _ := os.Hostname()
		gwID := "gw-" + host + "-" + cp.GatewayAddr
		gw, err := gateway.New(gateway.Config{TrustDomain: b.TrustDomain, NodeRoots: roots, ServerCert: serverCert,
			GatewayID: gwID, Clock: o.Clock, Log: o.Log, RevocationPoll: o.RevocationPoll, CommandPoll: o.CommandPoll, Heartbeat: o.SessionHeartbeat},
			svc, registry{cp.Nodes}, cp.Commands, cp.Bus)
		if err != nil {
			lis.Close()
			return fail(err)
		}
		cp.Gateway = gw
		gs := gw.GRPCServer()
		cp.wg.Add(2)
		go func() { defer cp.wg.Done(); gw.Run(rctx) }()
		go func() { defer cp.wg.Done(); _ = gs.Serve(lis) }()
		cp.closers = append(cp.closers, gs.Stop)
	}

	if hasAPI {
		mods := api.Modules{Nodes: cp.Nodes, Commands: cp.Commands, Events: cp.Events, IAM: cp.IAM, Keys: cp.APIKeys, Secrets: cp.Secrets, Sandboxes: cp.Sandboxes, Quotas: cp.Quotas}
		// Idempotency digests are keyed, so a stored digest of a body that
		// carried a secret is no guessing oracle.
		srv, err := api.NewServer(api.Config{TrustedProxies: o.TrustedProxies, SessionCookies: o.SessionCookies, BaseURL: o.BaseURL, RateLimits: o.RateLimits, TenantMutates: o.TenantMutates},
			api.Deps{DB: o.DB, Keys: cp.APIKeys, IAM: cp.IAM, Resolvers: mods.Resolvers(), Clock: o.Clock, Log: o.Log, Metrics: cp.Metrics, IdempotencyKey: IdempotencyKey(o.KEK)})
		if err != nil {
			return fail(err)
		}
		srv.Register(api.Methods(mods)...)
		srv.Register(api.BatchMethods(api.BatchModules{Quorum: cp.Quorum, Commands: cp.Commands})...)
		cp.API = srv
		pages := map[string]http.Handler{
			"/.well-known/better-compute": api.NewWellKnown(b).Handler(o.Log),
			"/healthz": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				api.SecurityHeaders(w, r)
				_, _ = w.Write([]byte("ok\n"))
			}),
		}
		lis, err := net.Listen("tcp", orDefault(o.APIListen, "127.0.0.1:0"))
		if err != nil {
			return fail(errs.Wrap(errs.InvalidConfig, "the API cannot listen on its address", err))
		}
		cp.APIAddr = lis.Addr().String()
		hs := &http.Server{Handler: api.Guard(api.Site(srv, pages)), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, MaxHeaderBytes: 64 << 10,
			// OPTIONS * would be answered by net/http itself, outside the envelope.
			DisableGeneralOptionsHandler: true}
		cp.wg.Add(1)
		go func() {
			defer cp.wg.Done()
			if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				o.Log.Error("api server stopped", "err", err)
			}
		}()
		cp.closers = append(cp.closers, func() { _ = hs.Close() })
	}
	if o.MetricsListen != "" {
		if err := cp.serveMetrics(o); err != nil {
			return fail(err)
		}
	}
	return cp, nil
}

// serveInternal serves the internal channel gateways relay to, with a
// control certificate issued now from the internal CA.
func (cp *ControlPlane) serveInternal(o Options, local gatewayServices, internalKey crypto.Signer, now time.Time) error {
	b := o.Bundle
	host, _, err := net.SplitHostPort(o.InternalListen)
	if err != nil {
		return errs.Wrap(errs.InvalidConfig, "the internal channel address is not host:port", err)
	}
	var dns []string
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	if ip := net.ParseIP(host); ip != nil {
		ips = append(ips, ip)
	} else if host != "" {
		dns = append(dns, host)
	}
	cert, err := pki.IssueControlCert(b.InternalCA, internalKey, b.TrustDomain, dns, ips, 7*24*time.Hour, now)
	if err != nil {
		return fmt.Errorf("server: control certificate: %w", err)
	}
	roots, err := b.TrustBundle(now).NodeRootPool()
	if err != nil {
		return fmt.Errorf("server: node roots: %w", err)
	}
	lis, err := net.Listen("tcp", o.InternalListen)
	if err != nil {
		return errs.Wrap(errs.InvalidConfig, "the internal channel cannot listen on its address", err)
	}
	cp.InternalAddr = lis.Addr().String()
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(controlTLS(cert, b.InternalCA))),
		grpc.MaxRecvMsgSize(nodev1.MaxMessageBytes), grpc.MaxSendMsgSize(nodev1.MaxMessageBytes),
		grpc.UnaryInterceptor(requireGateway(b.TrustDomain, b.InternalCA, o.Clock)))
	internalv1.RegisterGatewayServicesServer(gs, &controlServer{svc: local, roots: roots, td: b.TrustDomain, clk: o.Clock, log: o.Log})
	cp.wg.Add(1)
	go func() { defer cp.wg.Done(); _ = gs.Serve(lis) }()
	cp.closers = append(cp.closers, gs.Stop)
	return nil
}

// serveMetrics serves GET /metrics of cp.Metrics on its own listener.
func (cp *ControlPlane) serveMetrics(o Options) error {
	lis, err := net.Listen("tcp", o.MetricsListen)
	if err != nil {
		return errs.Wrap(errs.InvalidConfig, "the metrics listener cannot listen on its address", err)
	}
	cp.MetricsAddr = lis.Addr().String()
	metrics := promhttp.HandlerFor(cp.Metrics, promhttp.HandlerOpts{})
	pages := map[string]http.Handler{"/metrics": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api.SecurityHeaders(w, r)
		metrics.ServeHTTP(w, r)
	})}
	hs := &http.Server{Handler: api.Guard(api.Site(api.NotFound(), pages)), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10,
		DisableGeneralOptionsHandler: true}
	cp.wg.Add(1)
	go func() {
		defer cp.wg.Done()
		if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			o.Log.Error("metrics server stopped", "err", err)
		}
	}()
	cp.closers = append(cp.closers, func() { _ = hs.Close() })
	return nil
}

// IdempotencyKey is the key of the stored idempotency digests, derived
// from the key-encryption key.
func IdempotencyKey(kek pki.KEK) []byte {
	k := sha256.Sum256(append([]byte("bc-idempotency-v1\x00"), kek[:]...))
	return k[:]
}

// sweep cancels expired commands every few seconds and forgets expired
// idempotency keys.
func (cp *ControlPlane) sweep(ctx context.Context, clk clock.Clock, log *slog.Logger) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := cp.Commands.SweepExpired(ctx); err != nil && ctx.Err() == nil {
				log.Error("sweep expired commands", "err", err)
			}
			if _, err := api.SweepIdempotency(ctx, cp.DB, clk.Now()); err != nil && ctx.Err() == nil {
				log.Error("sweep idempotency keys", "err", err)
			}
		}
	}
}

// Close stops every role and waits for them.
func (cp *ControlPlane) Close() {
	if cp.cancel != nil {
		cp.cancel()
	}
	for _, c := range cp.closers {
		c()
	}
	cp.wg.Wait()
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
