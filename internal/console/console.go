// Package console is the web console the api role serves at /console/:
// server-rendered HTML pages (html/template, embedded) for the fleet, a
// command and its attested result, destructive batches, pending agent
// approvals, the audit log, sandboxes and templates.
//
// Why it is shaped this way: a browser is the most exposed client there
// is, so the console adds no second way to authorize anything. Sign-in
// trades an API key for a session through the API's own sessions.create;
// every page then reads, and every form mutates, by calling the API's
// envelope in process (a synthesized POST /api/v1/<method> with the
// session cookie, the exact Origin, X-Better-Compute: 1 and the caller's
// address), so IAM, tenancy, rate limits and audit apply exactly as they
// do to any other client. The pages carry no script at all and a strict
// Content-Security-Policy; every string is escaped by html/template; every
// form POST needs the exact Origin and a CSRF token bound to the session.
package console

import (
	"crypto/ed25519"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/mod/sumdb/note"

	"github.com/bettercompute/bettercompute/internal/auditlog"
)

// Prefix is the path the console is served under.
const Prefix = "/console/"

// CSP is the Content-Security-Policy of every console answer: nothing may
// load but the console's own stylesheet and images, no script runs, forms
// post only to the console's origin, and no page may frame it.
const CSP = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static/console.css
var consoleCSS []byte

// Config configures the console.
type Config struct {
	// API is the api role's envelope (api.Server); every page calls it.
	API http.Handler
	// SessionCookies and BaseURL are the API's settings: the console
	// needs the session cookie enabled, and its Origin is BaseURL's.
	SessionCookies bool
	BaseURL        string
	// Deployment and AuditKeys are the deployment's name and its public
	// audit keys (pki.Bundle.AuditKeys), which the audit page checks the
	// latest checkpoint's signature and an inclusion proof against. No
	// keys: the page shows the checkpoint unverified.
	Deployment string
	AuditKeys  []ed25519.PublicKey
	Log        *slog.Logger
}

// Console serves the console's pages.
type Console struct {
	api    http.Handler
	origin string
	// secure marks the cookie Secure when the base URL is https (TLS
	// served here or by a proxy in front).
	secure bool
	// disabled explains why the console cannot sign anyone in ("" when
	// it can).
	disabled string
	// auditKeys verify checkpoints (nil: none given).
	auditKeys note.Verifier
	tmpl      *template.Template
	mux       *http.ServeMux
	log       *slog.Logger
}

// New returns the console. Without session cookies (or a base URL) it
// serves a page that says so: the API would refuse its sessions.
func New(cfg Config) (*Console, error) {
	if cfg.API == nil {
		return nil, errors.New("console: no API handler")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	t, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	c := &Console{api: cfg.API, tmpl: t, log: cfg.Log}
	if len(cfg.AuditKeys) > 0 {
		ring, err := auditlog.NewKeyRing(cfg.Deployment, cfg.AuditKeys)
		if err != nil {
			return nil, fmt.Errorf("console: audit keys: %w", err)
		}
		c.auditKeys = ring
	}
	u, err := url.Parse(cfg.BaseURL)
	switch {
	case !cfg.SessionCookies:
		c.disabled = "The console needs the API's session cookie: set api.session_cookies = true and api.base_url (serve --session-cookies --base-url)."
	case err != nil || u.Scheme == "" || u.Host == "":
		c.disabled = "The console needs api.base_url, such as https://bc.example.com."
	default:
		c.origin, c.secure = u.Scheme+"://"+u.Host, u.Scheme == "https"
	}
	c.routes()
	return c, nil
}

// Mount returns next with the console answering /console and every path
// under /console/; next answers all else.
func Mount(next http.Handler, cfg Config) (http.Handler, error) {
	c, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/console" || strings.HasPrefix(r.URL.Path, Prefix) {
			c.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	}), nil
}

// Headers sets the headers of every console answer.
func Headers(h http.Header) {
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: under no-referrer a browser sends
	// "Origin: null" with a form POST, which the exact-Origin rule must
	// refuse. same-origin still sends no referrer to any other site.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// ServeHTTP answers one console request with the console's headers.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	Headers(w.Header())
	if c.disabled != "" && !strings.HasPrefix(r.URL.Path, Prefix+"static/") {
		c.render(w, r, http.StatusServiceUnavailable, "error", page{Title: "Console unavailable", Error: &apiError{Code: "UNAVAILABLE", Message: c.disabled}})
		return
	}
	c.mux.ServeHTTP(w, r)
}

// routes builds the console's routes.
func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /console/static/console.css", serveCSS)
	m.HandleFunc("GET /console", func(w http.ResponseWriter, r *http.Request) { redirect(w, r, Prefix) })
	m.HandleFunc("GET /console/{$}", func(w http.ResponseWriter, r *http.Request) { redirect(w, r, Prefix+"fleet") })
	m.HandleFunc("GET /console/signin", c.signInPage)
	m.HandleFunc("POST /console/signin", c.signIn)
	m.HandleFunc("POST /console/signout", c.mutation(c.signOut))
	m.HandleFunc("GET /console/fleet", c.signedIn(c.fleet))
	m.HandleFunc("GET /console/commands/{id}", c.signedIn(c.command))
	m.HandleFunc("GET /console/batches", c.signedIn(c.batches))
	m.HandleFunc("GET /console/batches/{id}", c.signedIn(c.batch))
	m.HandleFunc("GET /console/approvals", c.signedIn(c.approvals))
	m.HandleFunc("POST /console/approvals/{id}/{verdict}", c.mutation(c.decide))
	m.HandleFunc("GET /console/audit", c.signedIn(c.audit))
	m.HandleFunc("GET /console/audit/proof/{id}", c.signedIn(c.proof))
	m.HandleFunc("GET /console/sandboxes", c.signedIn(c.sandboxes))
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c.render(w, r, http.StatusNotFound, "error", page{Title: "Not found", Error: &apiError{Code: "NOT_FOUND", Message: "no such page"}})
	})
	c.mux = m
}

// serveCSS serves the console's one stylesheet.
func serveCSS(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	if r.Method != http.MethodHead {
		_, _ = w.Write(consoleCSS)
	}
}

// redirect answers 303 See Other to path.
func redirect(w http.ResponseWriter, r *http.Request, path string) {
	http.Redirect(w, r, path, http.StatusSeeOther)
}
