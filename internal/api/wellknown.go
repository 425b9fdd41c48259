package api

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/pki"
)

// WellKnown is the public description of a deployment served at
// GET /.well-known/better-compute: its trust domain and public keys only.
type WellKnown struct {
	TrustDomain string             `json:"trust_domain"`
	Deployment  string             `json:"deployment"`
	Keys        jose.JSONWebKeySet `json:"keys"`
	NodeCA      string             `json:"node_ca_pem"`
	ServerCA    string             `json:"server_ca_pem"`
	CommandRoot string             `json:"command_root_pem"`
	extra       []jose.JSONWebKey  // for tests: keys added as given
}

// NewWellKnown describes b's public material: the join keys, the audit
// keys and the command-signing roots as Ed25519 JWKs, and the CA
// certificates (PEM, every trusted one while a CA rotates). The active key
// of each kind has the plain id ("join", "audit", "command-root"); the
// others, staged, previous or (audit) retired, follow as "join-2",
// "audit-2", ….
func NewWellKnown(b *pki.Bundle) WellKnown {
	w := WellKnown{TrustDomain: b.TrustDomain, Deployment: b.Deployment,
		NodeCA: pemAll(b.NodeRoots()), ServerCA: string(b.APICAPEM()), CommandRoot: pemAll(b.CommandRoots())}
	add := func(id string, i int, key ed25519.PublicKey, chain []*x509.Certificate) {
		if i > 0 {
			id = fmt.Sprintf("%s-%d", id, i+1)
		}
		w.Keys.Keys = append(w.Keys.Keys, jose.JSONWebKey{Key: key, KeyID: id, Algorithm: string(jose.EdDSA), Use: "sig", Certificates: chain})
	}
	for i, k := range b.JoinKeys() {
		add("join", i, k, nil)
	}
	for i, k := range b.AuditKeys() {
		add("audit", i, k, nil)
	}
	for i, c := range b.CommandRoots() {
		if pub, ok := c.PublicKey.(ed25519.PublicKey); ok {
			add("command-root", i, pub, []*x509.Certificate{c})
		}
	}
	return w
}

func pemAll(certs []*x509.Certificate) string {
	var out []byte
	for _, c := range certs {
		out = append(out, pki.CertPEM(c.Raw)...)
	}
	return string(out)
}

// privateMembers are the JWK members that carry private key material
// (RFC 7517/7518): none of them may ever be served.
var privateMembers = []string{"d", "p", "q", "dp", "dq", "qi", "oth", "k"}

// Marshal encodes w, refusing (and so never serving) a document in which
// any key carries a private member.
func (w WellKnown) Marshal() ([]byte, error) {
	ks := append(append([]jose.JSONWebKey{}, w.Keys.Keys...), w.extra...)
	pub := make([]jose.JSONWebKey, 0, len(ks))
	for _, k := range ks {
		if !k.IsPublic() {
			return nil, errors.New("api: well-known key set holds a private key")
		}
		pub = append(pub, k)
	}
	w.Keys.Keys = pub
	b, err := json.MarshalIndent(w, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("api: encode well-known: %w", err)
	}
	var probe struct {
		Keys struct {
			Keys []map[string]json.RawMessage `json:"keys"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("api: re-read well-known: %w", err)
	}
	for _, k := range probe.Keys.Keys {
		for _, m := range privateMembers {
			if _, ok := k[m]; ok {
				return nil, fmt.Errorf("api: well-known key carries private member %q", m)
			}
		}
	}
	return append(b, '\n'), nil
}

// Handler serves the document; a document that fails Marshal answers 500
// with no key material.
func (w WellKnown) Handler(log interface{ Error(string, ...any) }) http.Handler {
	body, err := w.Marshal()
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rid := SecurityHeaders(rw, r)
		rw.Header().Set("Content-Type", "application/json")
		if err != nil {
			log.Error("well-known document refused", "request_id", rid, "err", err)
			var eb ErrorBody
			eb.Error.Code, eb.Error.Message, eb.Error.RequestID = string(errs.Internal), "internal error", rid
			rw.WriteHeader(http.StatusInternalServerError)
			_ = json.NewEncoder(rw).Encode(eb)
			return
		}
		_, _ = rw.Write(body)
	})
}

// Guard refuses TRACE, CONNECT and TRACK on every path, and sets the
// security headers on every answer that passes through it.
func Guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodTrace, http.MethodConnect, "TRACK":
			writeError(w, r, http.StatusMethodNotAllowed, errs.InvalidInput, "method not allowed")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Site routes one listener. Every path under /api/ goes to the envelope
// (which answers an unknown one NOT_FOUND after authentication); a GET or
// HEAD of a path in pages goes to its handler; any other request answers
// in the envelope's JSON error shape with its headers: 405 (with Allow)
// for another method on a page, 404 NOT_FOUND for any other path. Paths
// are taken as sent: nothing is cleaned or redirected. Wrap it in Guard.
func Site(envelope http.Handler, pages map[string]http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/api/") {
			envelope.ServeHTTP(w, r)
			return
		}
		page, ok := pages[r.URL.Path]
		switch {
		case ok && (r.Method == http.MethodGet || r.Method == http.MethodHead):
			page.ServeHTTP(w, r)
		case ok:
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, r, http.StatusMethodNotAllowed, errs.InvalidInput, "method not allowed")
		default:
			writeError(w, r, http.StatusNotFound, errs.NotFound, "not found")
		}
	})
}

// NotFound answers every request 404 NOT_FOUND in the envelope's shape.
func NotFound() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, http.StatusNotFound, errs.NotFound, "not found")
	})
}

// writeError answers with the security headers and the JSON error shape.
func writeError(w http.ResponseWriter, r *http.Request, status int, code errs.Code, msg string) {
	rid := SecurityHeaders(w, r)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var eb ErrorBody
	eb.Error.Code, eb.Error.Message, eb.Error.RequestID = string(code), msg, rid
	_ = json.NewEncoder(w).Encode(eb)
}
