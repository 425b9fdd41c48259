package api

import (
	"net"
	"net/http"
	"net/netip"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// OnlyFromProxies guards a plain-HTTP API listener on a non-loopback
// address: a request whose socket peer is not one of the trusted proxies
// (which terminate TLS in front of the API) is answered 403
// ACCESS_DENIED before anything reads it, so that an API key sent in
// clear from elsewhere is never used.
func OnlyFromProxies(p Proxies, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		peer, perr := netip.ParseAddr(host)
		if err != nil || perr != nil || !p.trusted(peer) {
			writeError(w, r, http.StatusForbidden, errs.AccessDenied, "this API listener serves plain HTTP only to its trusted proxies: use https through the proxy")
			return
		}
		next.ServeHTTP(w, r)
	})
}
