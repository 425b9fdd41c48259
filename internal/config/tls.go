package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// LoopbackHost reports whether host (of a host:port listen address) is a
// loopback address or localhost; "" (every interface) is not.
func LoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// PlainHTTPProblem says why the API may not serve plain HTTP on listen
// with trustedProxies, or "" when it may: only on a loopback address, or
// behind trusted proxies (which then are the only peers answered). API
// keys would otherwise cross the network in clear.
func PlainHTTPProblem(listen string, trustedProxies int) string {
	host, _, err := net.SplitHostPort(listen)
	if err == nil && LoopbackHost(host) || trustedProxies > 0 {
		return ""
	}
	return "plain HTTP would send API keys in clear: set api.listen to a loopback address, or api.trusted_proxies to the TLS-terminating proxies, or remove plain_http to serve TLS (api.names, or api.cert_file and api.key_file)"
}

// validateAPITLS checks the API's TLS settings.
func (c Config) validateAPITLS(p *problems) {
	if !slices.Contains(c.Roles, RoleAPI) {
		return
	}
	a := c.API
	if (a.CertFile == "") != (a.KeyFile == "") {
		p.add("api.cert_file", "set both api.cert_file and api.key_file, or neither (the api then issues its certificate from the internal CA)")
	}
	if a.PlainHTTP {
		if a.CertFile != "" {
			p.add("api.plain_http", "conflicts with api.cert_file: choose TLS or plain HTTP")
		}
		if msg := PlainHTTPProblem(a.Listen, len(a.TrustedProxies)); msg != "" {
			p.add("api.plain_http", msg)
		}
		return
	}
	if a.CertFile == "" && len(a.Names) == 0 {
		p.add("api.names", "at least one DNS name or IP for the API's certificate (loopback is always included)")
	}
	for i, n := range a.Names {
		if n == "" || strings.ContainsAny(n, " /:") && net.ParseIP(n) == nil {
			p.add(fmt.Sprintf("api.names[%d]", i), "a DNS name or an IP address")
		}
	}
}
