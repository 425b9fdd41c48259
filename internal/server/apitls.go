package server

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/config"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/pki"
)

// checkAPITLS refuses an API transport that would carry API keys in clear
// over the network: plain HTTP is served only when asked, and only on a
// loopback address or behind trusted proxies.
func checkAPITLS(o Options) error {
	if !o.APIPlainHTTP {
		return nil
	}
	if o.APICert != nil {
		return errs.New(errs.InvalidConfig, "api.plain_http conflicts with api.cert_file: choose TLS or plain HTTP")
	}
	if msg := config.PlainHTTPProblem(orDefault(o.APIListen, "127.0.0.1:0"), len(o.TrustedProxies)); msg != "" {
		return errs.New(errs.InvalidConfig, "api.plain_http: "+msg)
	}
	return nil
}

// issuesAPICert reports whether the api role issues its TLS certificate
// itself from the internal CA (and so unseals the internal CA key).
func issuesAPICert(o Options) bool { return !o.APIPlainHTTP && o.APICert == nil }

// apiListener listens on o.APIListen: TLS with o.APICert or a certificate
// issued from the internal CA, or plain HTTP as checkAPITLS allowed it (on
// a non-loopback address h then answers only the trusted proxies).
func apiListener(o Options, k keys, now time.Time, h http.Handler) (net.Listener, http.Handler, error) {
	listen := orDefault(o.APIListen, "127.0.0.1:0")
	var getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	switch {
	case o.APIPlainHTTP:
	case o.APICert != nil:
		c := o.APICert
		getCert = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c, nil }
	default:
		src, err := newCertSource("API", o.Clock, o.Log, now, apiCert(o, k))
		if err != nil {
			return nil, nil, err
		}
		getCert = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return src.get() }
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, nil, errs.Wrap(errs.InvalidConfig, "the API cannot listen on its address", err)
	}
	if getCert == nil {
		if host, _, _ := net.SplitHostPort(listen); !config.LoopbackHost(host) {
			h = api.OnlyFromProxies(o.TrustedProxies, h)
		}
		return lis, h, nil
	}
	return tls.NewListener(lis, &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCert, NextProtos: []string{"http/1.1"}}), h, nil
}

// certSource is a server certificate the process issues itself from the
// internal CA (the API's, and the gateway's when it runs with the api
// role), issued again once half its lifetime has passed, so that a
// long-running process never serves an expired certificate. Handshakes
// read it through get.
type certSource struct {
	what  string // "API" or "gateway", for the log
	issue func(now time.Time) (tls.Certificate, error)
	clk   clock.Clock
	log   *slog.Logger

	mu      sync.Mutex
	cur     *tls.Certificate
	renewAt time.Time
}

// newCertSource issues the first certificate at now.
func newCertSource(what string, clk clock.Clock, log *slog.Logger, now time.Time, issue func(time.Time) (tls.Certificate, error)) (*certSource, error) {
	s := &certSource{what: what, issue: issue, clk: clk, log: log}
	if _, err := s.renew(now); err != nil {
		return nil, err
	}
	return s, nil
}

// renew issues a certificate at now and makes it current.
func (s *certSource) renew(now time.Time) (*tls.Certificate, error) {
	c, err := s.issue(now)
	if err != nil {
		return nil, fmt.Errorf("server: %s certificate: %w", s.what, err)
	}
	s.cur, s.renewAt = &c, now.Add(c.Leaf.NotAfter.Sub(now)/2)
	return s.cur, nil
}

// get returns the current certificate, issuing a new one when it is due;
// when that fails it keeps serving the current one until it expires.
func (s *certSource) get() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	if now.Before(s.renewAt) {
		return s.cur, nil
	}
	prev := s.cur
	c, err := s.renew(now)
	if err == nil {
		return c, nil
	}
	if now.Before(prev.Leaf.NotAfter) {
		s.log.Error("renew server certificate", "what", s.what, "err", err)
		// Try again in a minute, not on every handshake meanwhile.
		s.renewAt = now.Add(time.Minute)
		return prev, nil
	}
	return nil, err
}

// apiCert issues the API's certificate at now for o.APINames, o.APIListen's
// host and loopback.
func apiCert(o Options, k keys) func(time.Time) (tls.Certificate, error) {
	return func(now time.Time) (tls.Certificate, error) {
		b := o.Bundle
		dns, ips := apiNames(o)
		return pki.IssueAPICert(b.InternalCA, k.internal, b.TrustDomain, dns, ips, serverCertLifetime, now)
	}
}

// apiNames splits o.APINames into DNS names and IPs, with loopback and
// o.APIListen's host (when it is a specific address).
func apiNames(o Options) ([]string, []net.IP) {
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	var dns []string
	for _, n := range o.APINames {
		if ip := net.ParseIP(n); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, n)
		}
	}
	if host, _, err := net.SplitHostPort(o.APIListen); err == nil {
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
			ips = append(ips, ip)
		}
	}
	return dns, ips
}
