package server

import (
	"context"
	"crypto"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/console"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/gateway"
	"github.com/bettercompute/bettercompute/internal/idempotency"
	"github.com/bettercompute/bettercompute/internal/mcpgate"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/internalv1"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/tickets/spentdb"
)

// Intervals of the workers role's loops.
const (
	signInterval    = time.Second
	sweepInterval   = 5 * time.Second
	sandboxInterval = 2 * time.Second
	// serverCertLifetime is the lifetime of the gateway and control
	// certificates a process issues itself at start.
	serverCertLifetime = 7 * 24 * time.Hour
)

// startWorkers starts the workers role: the signer, the expiry sweep, the
// audit job and the sandboxes' loop.
func (cp *ControlPlane) startWorkers(o Options) error {
	cp.runLoop(func(ctx context.Context) { cp.Signer.Run(ctx, signInterval) })
	cp.startRevocationSigner(o)
	cp.runLoop(func(ctx context.Context) {
		every(ctx, o.Clock, sweepInterval, func(ctx context.Context) { cp.sweep(ctx, o) })
	})
	if err := cp.startAudit(o); err != nil {
		return err
	}
	cp.runLoop(func(ctx context.Context) { cp.Sandboxes.Run(ctx, sandboxInterval) })
	return nil
}

// sweep cancels expired commands and forgets expired idempotency keys.
func (cp *ControlPlane) sweep(ctx context.Context, o Options) {
	_, err := cp.Commands.SweepExpired(ctx)
	logErr(ctx, o.Log, "sweep expired commands", err)
	_, err = idempotency.Sweep(ctx, cp.DB, o.Clock.Now())
	logErr(ctx, o.Log, "sweep idempotency keys", err)
	_, err = spentdb.New(cp.DB).Sweep(ctx, o.Clock.Now())
	logErr(ctx, o.Log, "sweep spent tickets", err)
}

// startGateway starts the gateway role: its own certificate (or one issued
// now from the internal CA), its services (local, or relayed to the api's
// internal channel without the api role), its listener and loops.
func (cp *ControlPlane) startGateway(o Options, r roles, k keys, local gatewayServices, now time.Time) error {
	b := o.Bundle
	serverCert, certs, err := gatewayCert(o, k, now)
	if err != nil {
		return err
	}
	var getCert func() (*tls.Certificate, error)
	if certs != nil {
		getCert = certs.get
	}
	var svc gateway.Services = local
	desired := cp.desiredStates()
	if !r.api {
		conn, err := dialControl(o.Control, serverCert, b, o.Clock)
		if err != nil {
			return errs.Wrap(errs.InvalidConfig, "the internal channel address is not usable", err)
		}
		cp.closers = append(cp.closers, func() { _ = conn.Close() })
		client := internalv1.NewGatewayServicesClient(conn)
		svc = &relayServices{local: local, client: client, clk: o.Clock}
		if desired == nil {
			desired = relayedDesiredStates{client: client}
		}
	}
	roots, err := b.TrustBundle(now).NodeRootPool()
	if err != nil {
		return fmt.Errorf("server: node roots: %w", err)
	}
	lis, err := net.Listen("tcp", orDefault(o.GatewayListen, "127.0.0.1:0"))
	if err != nil {
		return errs.Wrap(errs.InvalidConfig, "the gateway cannot listen on its address", err)
	}
	cp.GatewayAddr = lis.Addr().String()
	// A gateway's id is stable across restarts on the same host and
	// address, so a restarted gateway closes the sessions its previous run
	// left open in the registry.
	host, _ := os.Hostname()
	gw, err := gateway.New(gateway.Config{TrustDomain: b.TrustDomain, NodeRoots: roots, ServerCert: serverCert, GetServerCert: getCert,
		GatewayID: "gw-" + host + "-" + cp.GatewayAddr, Clock: o.Clock, Log: o.Log,
		RevocationPoll: o.RevocationPoll, CommandPoll: o.CommandPoll, Heartbeat: o.SessionHeartbeat,
		Tickets: cp.ticketVerifier, Spent: spentdb.New(o.DB), Feed: cp.Revocations, DesiredStates: desired, Bastions: cp.bastionServices()},
		svc, registry{cp.Nodes}, cp.Commands, cp.Bus)
	if err != nil {
		lis.Close()
		return err
	}
	if err := gw.CloseStale(cp.ctx); err != nil {
		lis.Close()
		return err
	}
	cp.Gateway = gw
	if cp.Tunnels != nil {
		cp.Tunnels.SetOpener(tunnelOpener{gw})
	}
	// The gateway's loops (dispatch, revocations, heartbeat) outlive the
	// roles' context until its listener has stopped, so that sessions still
	// open in the shutdown grace keep getting their commands.
	gwCtx, stopGW := context.WithCancel(context.WithoutCancel(cp.ctx))
	cp.runLoop(func(context.Context) { gw.Run(gwCtx) })
	cp.serveGRPC("gateway", gw.GRPCServer(), lis, stopGW)
	return nil
}

// gatewayCert is the gateway's own certificate (from pki issue-gateway),
// or, with the api role, a source of certificates the process issues from
// the internal CA for o.GatewayNames and loopback and reissues at half
// their lifetime (nil with a certificate of its own).
func gatewayCert(o Options, k keys, now time.Time) (tls.Certificate, *certSource, error) {
	if o.GatewayCert != nil {
		return *o.GatewayCert, nil, nil
	}
	b := o.Bundle
	src, err := newCertSource("gateway", o.Clock, o.Log, now, func(now time.Time) (tls.Certificate, error) {
		return pki.IssueServerCert(b.InternalCA, k.internal, b.TrustDomain, o.GatewayNames,
			[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, serverCertLifetime, now)
	})
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return *src.cur, src, nil
}

// startAPI starts the api role: the envelope and method table, the
// well-known and health pages, and the HTTP listener.
func (cp *ControlPlane) startAPI(o Options, k keys, now time.Time) error {
	b := o.Bundle
	mods := api.Modules{Nodes: cp.Nodes, Commands: cp.Commands, Events: cp.Events, IAM: cp.IAM, Keys: cp.APIKeys, Secrets: cp.Secrets, Sandboxes: cp.Sandboxes, Quotas: cp.Quotas,
		Tunnels: cp.Tunnels, BreakGlass: cp.BreakGlass, Revocations: cp.Revocations, Bastions: cp.Bastions, Previews: cp.Previews}
	// Idempotency digests are keyed, so a stored digest of a body that
	// carried a secret is no guessing oracle.
	srv, err := api.NewServer(api.Config{TrustedProxies: o.TrustedProxies, SessionCookies: o.SessionCookies, BaseURL: o.BaseURL, RateLimits: o.RateLimits, TenantMutates: o.TenantMutates},
		api.Deps{DB: o.DB, Keys: cp.APIKeys, IAM: cp.IAM, Resolvers: mods.Resolvers(), Clock: o.Clock, Log: o.Log, Metrics: cp.Metrics, IdempotencyKey: IdempotencyKey(o.KEK)})
	if err != nil {
		return err
	}
	srv.Register(api.Methods(mods)...)
	srv.Register(api.BatchMethods(api.BatchModules{Quorum: cp.Quorum, Commands: cp.Commands})...)
	auditLog, err := auditlog.New(auditlog.Config{DB: o.DB, Deployment: b.Deployment, Clock: o.Clock, Log: o.Log})
	if err != nil {
		return err
	}
	srv.Register(api.AuditMethods(auditLog)...)
	if cp.Sandboxes != nil {
		srv.ServeUploads(cp.Sandboxes)
	}
	var execTarget api.ExecTarget
	if cp.Sandboxes != nil {
		execTarget = cp.Sandboxes.ExecTarget
	}
	srv.ServeTunnels(cp.Tunnels, execTarget)
	cp.serveBastionLanes(srv, o)
	// Tunnels are hijacked connections, which the HTTP server's shutdown
	// does not wait for: they are closed when the roles stop.
	cp.runLoop(func(ctx context.Context) { <-ctx.Done(); cp.Tunnels.CloseAll() })
	cp.followRevocations(o)
	cp.cacheAccess(srv)
	cp.API = srv
	pages := map[string]http.Handler{
		"/.well-known/better-compute": api.NewWellKnown(b).Handler(o.Log),
		"/healthz": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			api.SecurityHeaders(w, r)
			_, _ = w.Write([]byte("ok\n"))
		}),
	}
	gate := mcpgate.New(mcpgate.Options{Log: o.Log}).HTTP(srv)
	site, err := console.Mount(mcpgate.Route(api.Site(srv, pages), gate), console.Config{API: srv, SessionCookies: o.SessionCookies, BaseURL: o.BaseURL,
		Deployment: b.Deployment, AuditKeys: b.AuditKeys(), Log: o.Log})
	if err != nil {
		return err
	}
	lis, handler, err := apiListener(o, k, now, api.Guard(site))
	if err != nil {
		return err
	}
	cp.APIAddr = lis.Addr().String()
	cp.serveHTTP("api", &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, MaxHeaderBytes: 64 << 10,
		// OPTIONS * would be answered by net/http itself, outside the envelope.
		DisableGeneralOptionsHandler: true}, lis)
	return nil
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
	certs, err := newCertSource("internal channel", o.Clock, o.Log, now, func(now time.Time) (tls.Certificate, error) {
		return pki.IssueControlCert(b.InternalCA, internalKey, b.TrustDomain, dns, ips, serverCertLifetime, now)
	})
	if err != nil {
		return err
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
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(controlTLS(certs.get, b.InternalRoots()))),
		grpc.MaxRecvMsgSize(nodev1.MaxMessageBytes), grpc.MaxSendMsgSize(nodev1.MaxMessageBytes),
		grpc.UnaryInterceptor(requireGateway(b.TrustDomain, b.InternalRoots(), o.Clock)), grpc.WaitForHandlers(true))
	internalv1.RegisterGatewayServicesServer(gs, &controlServer{svc: local, desired: cp.desiredStates(), roots: roots, td: b.TrustDomain, clk: o.Clock, log: o.Log})
	cp.serveGRPC("internal channel", gs, lis, nil)
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
	cp.serveHTTP("metrics", &http.Server{Handler: api.Guard(api.Site(api.NotFound(), pages)), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10,
		DisableGeneralOptionsHandler: true}, lis)
	return nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
