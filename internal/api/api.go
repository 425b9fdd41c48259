// Package api is the public HTTP API: POST /api/v1/<service>.<method> with a
// JSON object body. Every method passes one envelope, in this order, before
// its handler runs: method and CSRF checks, caller address, authentication
// (failed attempts limited per address), method lookup, rate limit, size
// limit, strict decoding with input bounds (decode.go), tenant pre-check,
// tenant state, resource resolution, the access decision, idempotency.
// Handlers are reachable only through the registry, so no method can skip
// it.
package api

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bettercompute/bettercompute/internal/afterreply"
	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/idempotency"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/jsontime"
	"github.com/bettercompute/bettercompute/internal/ratelimit"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/tunnels"
)

// MaxBody bounds a request body.
const MaxBody = 64 << 10

// Caller is the authenticated caller of one request, with what the
// envelope resolved for it. Its two tenants differ: HomeTenant (from the
// embedded Principal) is the tenant the credential belongs to, which
// decides the caller's reach, its rate and slot limits, its denial rows
// and its idempotency keys; ActingTenant is the tenant the call acts in,
// which scopes its reads (Scope) and its audit rows (Actor).
type Caller struct {
	apikeys.Principal
	RequestID string
	// Addr is the caller's address for the audit log: the socket peer, or
	// the client named by a trusted proxy; "" when it cannot be told. It
	// never reaches an access decision.
	Addr string
	// ActingTenant is the tenant the call acts in: the input's tenant, the
	// resource's tenant, or the caller's own.
	ActingTenant string
	// allow decides a further action of the call (set by the envelope once
	// the method's own action is allowed).
	allow func(ctx context.Context, action, resource string) (bool, error)
}

// Allowed reports whether IAM allows the caller a further action on
// resource (a "<type>/<id>" path) in the tenant the call acts in, beyond
// the method's own action, under the caller's scopes; a refusal is
// recorded like the envelope's. False when the envelope set no decider.
func (c *Caller) Allowed(ctx context.Context, action, resource string) (bool, error) {
	if c.allow == nil {
		return false, nil
	}
	return c.allow(ctx, action, resource)
}

// Actor returns the audit entry prefilled with who is calling, from where,
// and in which tenant, and the credential presented (a session's id, else
// the key's; never written to the row).
func (c *Caller) Actor() audit.Entry {
	cred := c.KeyID
	if c.SessionID != "" {
		cred = c.SessionID
	}
	return audit.Entry{TenantID: c.ActingTenant, Actor: c.Identity, RequestID: c.RequestID, Caller: c.Addr, Credential: cred}
}

// Root reports whether the caller's home tenant (the one its credential
// belongs to, HomeTenant) is the root tenant, whatever tenant the call
// acts in.
func (c *Caller) Root() bool { return c.HomeTenant == iam.RootTenant }

// Scope is the tenancy scope of the call's reads: the tenant it acts in
// (ActingTenant), never the caller's home tenant. A root caller acting in
// a child tenant reads as that tenant.
func (c *Caller) Scope() iam.Scope { return iam.ScopeOf(c.ActingTenant) }

// Target is what a call's input names: a tenant, and/or one resource by
// kind and id. The envelope pre-checks the tenant and resolves the
// resource's tenant before deciding.
type Target struct {
	Tenant string
	Kind   string
	ID     string
}

// Method is one API method. Build it with Def.
type Method struct {
	// Name is "<service>.<method>".
	Name string
	// Action is decided for the caller, as compute:<resource>:<verb>.
	Action string
	// Mutates marks methods that change state (and are idempotent-keyed,
	// refused for suspended tenants, rate limited as mutations).
	Mutates bool

	// shownOnce marks a method whose answer carries a credential (a key,
	// a token, a session value): it is shown once, never stored, and an
	// idempotent replay answers CONFLICT instead of showing it again.
	shownOnce bool

	// perIdentity, when set, is a module's own limit on this method per
	// identity (LimitedPerIdentity), refused in the envelope.
	perIdentity *ratelimit.PerKey
	limitMsg    string

	// describe, when set, makes a delegated agent's call wait for its
	// person's approval of the text it builds (confirm.go).
	describe describer

	input  reflect.Type
	decode func(raw []byte) (any, Target, error)
	run    func(ctx context.Context, c *Caller, in any) (any, error)
}

// LimitedPerIdentity returns m limited by l per identity: once the
// caller is decided, a call finding no event left in l is refused
// RATE_LIMITED with msg and a Retry-After, before the method runs (so a
// client may send it again, as it does every RATE_LIMITED answer). A
// module keeps its own limits (10 tunnels a minute, 20 certificates an
// hour) this way rather than refusing inside its handler.
func (m Method) LimitedPerIdentity(l *ratelimit.PerKey, msg string) Method {
	m.perIdentity, m.limitMsg = l, msg
	return m
}

// Input is the Go type a call's body decodes into.
func (m Method) Input() reflect.Type { return m.input }

// ShownOnce returns m marked as answering with a credential: its answer
// is never kept for idempotent replay (a replay answers CONFLICT).
func (m Method) ShownOnce() Method {
	m.shownOnce = true
	return m
}

// Def defines a method whose input decodes strictly into In. target tells
// the envelope which tenant and resource the input names (nil: none).
func Def[In any](name, action string, mutates bool, target func(In) Target, h func(ctx context.Context, c *Caller, in In) (any, error)) Method {
	return Method{
		Name: name, Action: action, Mutates: mutates, input: reflect.TypeFor[In](),
		decode: func(raw []byte) (any, Target, error) {
			var in In
			if err := Decode(raw, &in); err != nil {
				return nil, Target{}, err
			}
			var t Target
			if target != nil {
				t = target(in)
			}
			return in, t, nil
		},
		run: func(ctx context.Context, c *Caller, in any) (any, error) { return h(ctx, c, in.(In)) },
	}
}

// Resolver returns the tenant a resource of one kind belongs to; an error
// coded NOT_FOUND when it does not exist.
type Resolver func(ctx context.Context, id string) (string, error)

// Config configures the envelope.
type Config struct {
	// TrustedProxies are the peers whose X-Forwarded-For is believed.
	TrustedProxies Proxies
	// SessionCookies enables the bc_session cookie; it then needs an
	// Origin exactly equal to BaseURL's origin.
	SessionCookies bool
	BaseURL        string
	RateLimits     RateLimits
	// TenantMutates bounds each tenant's mutating calls running at once
	// (0: DefaultTenantMutates); see tenantlimit.go.
	TenantMutates int
}

// Deps are the modules the envelope reads.
type Deps struct {
	DB        *store.DB
	Keys      *apikeys.Service
	IAM       *iam.Service
	Resolvers map[string]Resolver
	Clock     clock.Clock
	Log       *slog.Logger
	Metrics   prometheus.Registerer
	// IdempotencyKey keys the stored digest of a request body (HMAC, see
	// idempotency.DeriveKey), so the digest of a body that carried a
	// secret is no guessing oracle.
	IdempotencyKey []byte
}

// Server routes requests through the envelope to registered methods.
type Server struct {
	methods map[string]Method
	cfg     Config
	deps    Deps
	origin  string
	limiter *limiter
	denials *denialLimiter
	// authFailures limits failed authentications per caller address.
	authFailures *failLimiter
	tenants      *tenantLimiter
	idem         *idempotency.Store
	// uploads is the upload endpoint's module (nil: no endpoint).
	uploads Uploads
	// tunnels serves the tunnel endpoint (nil: its path is an unknown
	// method).
	tunnels    *tunnels.Service
	execTarget ExecTarget
	// lanes serves the bastion lane endpoint (nil: its path is an unknown
	// method).
	lanes LaneOpener
	// terminals serves the bastion terminal endpoint (nil: its path is an
	// unknown method).
	terminals TerminalOpener
	// access caches authentications and allowed read decisions (nil:
	// nothing is cached; CacheAccess).
	access *AccessCache

	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

// NewServer returns an API server with no methods.
func NewServer(cfg Config, deps Deps) (*Server, error) {
	if deps.Clock == nil {
		deps.Clock = clock.Real{}
	}
	if deps.Log == nil {
		deps.Log = slog.Default()
	}
	s := &Server{methods: map[string]Method{}, cfg: cfg, deps: deps,
		limiter: newLimiter(cfg.RateLimits, deps.Clock), denials: newDenialLimiter(deps.Clock),
		authFailures: newFailLimiter(cfg.RateLimits, deps.Clock),
		tenants:      newTenantLimiter(cfg.TenantMutates, TenantQueueWait),
		idem:         idempotency.New(deps.DB, deps.Clock, deps.IdempotencyKey, deps.Log)}
	if cfg.SessionCookies {
		o, err := originOf(cfg.BaseURL)
		if err != nil {
			return nil, errs.Wrap(errs.InvalidConfig, "session cookies need a base URL", err)
		}
		s.origin = o
	}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bc_api_requests_total", Help: "API requests by method and answer code."}, []string{"method", "code"})
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "bc_api_request_seconds", Help: "API request latency.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"method"})
	if deps.Metrics != nil {
		if err := deps.Metrics.Register(s.requests); err != nil {
			return nil, fmt.Errorf("api: register metrics: %w", err)
		}
		if err := deps.Metrics.Register(s.latency); err != nil {
			return nil, fmt.Errorf("api: register metrics: %w", err)
		}
	}
	return s, nil
}

// answersCredential reports the methods that answer with a credential (an
// API key, join tokens, a session value): Register marks them ShownOnce,
// wherever they are defined.
func answersCredential(name string) bool {
	switch name {
	case "apiKeys.create", "joinTokens.create", "joinTokens.createMany", "sessions.create":
		return true
	}
	return false
}

// Methods returns the registered methods, sorted by name.
func (s *Server) Methods() []Method {
	out := make([]Method, 0, len(s.methods))
	for _, m := range s.methods {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Method) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Register adds methods; a duplicate name panics at start-up.
func (s *Server) Register(ms ...Method) {
	for _, m := range ms {
		if answersCredential(m.Name) {
			m.shownOnce = true
		}
		if _, dup := s.methods[m.Name]; dup {
			panic("api: method registered twice: " + m.Name)
		}
		s.methods[m.Name] = m
	}
}

var requestIDRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// ErrorBody is the JSON shape of every error answer (declared in
// apitypes, which the client decodes it with).
type ErrorBody = apitypes.ErrorBody

// SecurityHeaders sets the headers every answer carries and returns the
// request id (the caller's when well-formed, else a fresh one).
func SecurityHeaders(w http.ResponseWriter, r *http.Request) string {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	rid := r.Header.Get("X-Request-Id")
	if !requestIDRE.MatchString(rid) {
		rid = ids.New("req_")
	}
	h.Set("X-Request-Id", rid)
	return rid
}

// answer is a finished response.
type answer struct {
	status int
	body   []byte
}

// ServeHTTP is the envelope. It answers every path it is given: a path
// that is not exactly /api/v1/<method> of a registered method is an
// unknown method (NOT_FOUND, after authentication).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.uploads != nil && strings.HasPrefix(r.URL.Path, UploadPath) {
		s.serveUploadHTTP(w, r)
		return
	}
	if s.lanes != nil && r.URL.Path == LaneConnectPath {
		s.serveLaneHTTP(w, r)
		return
	}
	if s.terminals != nil && r.URL.Path == TerminalPath {
		s.serveTerminalHTTP(w, r)
		return
	}
	if s.tunnels != nil && r.URL.Path == TunnelConnectPath {
		s.serveTunnelHTTP(w, r)
		return
	}
	start := time.Now()
	// Wake-ups the method defers (afterreply) run once the answer is out,
	// not while it is written.
	ctx, after := afterreply.With(r.Context())
	r = r.WithContext(ctx)
	defer after.Run()
	rid := SecurityHeaders(w, r)
	name, ok := strings.CutPrefix(r.URL.Path, "/api/v1/")
	m, known := s.methods[name]
	known = known && ok
	label := "unknown"
	if known {
		label = name
	}
	a, c := s.serve(r, rid, m, known)
	if retry := c.retryAfter; retry > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(int((retry+time.Second-1)/time.Second)))
	}
	w.Header().Set("Content-Type", "application/json")
	// The length lets the caller read the whole answer once it is
	// flushed: without it the answer is chunked, and its last chunk waits
	// for this handler to return, after the wake-ups below.
	w.Header().Set("Content-Length", strconv.Itoa(len(a.body)))
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	after.Run()
	s.requests.WithLabelValues(label, fmt.Sprint(a.status)).Inc()
	s.latency.WithLabelValues(label).Observe(time.Since(start).Seconds())
}

type outcome struct{ retryAfter time.Duration }

// errorAnswer is the error answer for err. A database that refused a
// write for want of space is UNAVAILABLE with a message saying so
// (store.Full), whatever the method made of the error: a caller can
// tell it from a fault of its call, and retry later.
func (s *Server) errorAnswer(rid string, err error) answer {
	if store.Full(err) {
		err = errs.Wrap(errs.Unavailable, store.DatabaseFullMessage, err)
	}
	code := errs.CodeOf(err)
	if code == errs.Internal {
		s.deps.Log.Error("request failed", "request_id", rid, "err", err)
	} else {
		s.deps.Log.Info("request refused", "request_id", rid, "code", code, "err", err)
	}
	return errorBody(rid, code, errs.SafeMessage(err))
}

// errorBody is the JSON error answer with the status that fits code.
func errorBody(rid string, code errs.Code, msg string) answer {
	var body ErrorBody
	body.Error.Code, body.Error.Message, body.Error.RequestID = string(code), msg, rid
	if code == errs.Internal {
		body.Error.Message = "internal error"
	}
	b, _ := json.Marshal(body)
	return answer{status: errs.HTTPStatus(code), body: append(b, '\n')}
}

// answerOf is the answer to a method that returned res and err.
func (s *Server) answerOf(c *Caller, res any, err error) answer {
	if err != nil {
		return s.errorAnswer(c.RequestID, err)
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return s.errorAnswer(c.RequestID, fmt.Errorf("api: encode answer: %w", err))
	}
	// Every *_at timestamp in one format: RFC 3339, UTC, milliseconds.
	return answer{status: http.StatusOK, body: append(jsontime.Normalize(b), '\n')}
}

func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

// SessionCookie is the name of the browser session cookie.
const SessionCookie = "bc_session"

// authenticate reads a bearer API key, or, when enabled, the session
// cookie with an Origin exactly equal to the configured one.
func (s *Server) authenticate(ctx context.Context, r *http.Request) (apikeys.Principal, error) {
	if authz := r.Header.Get("Authorization"); authz != "" {
		key, ok := strings.CutPrefix(authz, "Bearer ")
		if !ok {
			return apikeys.Principal{}, apikeys.ErrInvalid
		}
		return s.deps.Keys.Authenticate(ctx, key)
	}
	ck, err := r.Cookie(SessionCookie)
	if err != nil || !s.cfg.SessionCookies {
		return apikeys.Principal{}, apikeys.ErrInvalid
	}
	switch origin := r.Header.Get("Origin"); {
	case origin == "":
		return apikeys.Principal{}, errs.New(errs.CSRFRejected, "a session call needs an Origin header")
	case origin != s.origin:
		return apikeys.Principal{}, errs.New(errs.UntrustedOrigin, "the Origin is not this deployment's")
	}
	return s.deps.Keys.AuthenticateSession(ctx, ck.Value)
}

// recordDenial writes an audit row for a refused call, at most a few per
// minute per identity and action.
func (s *Server) recordDenial(ctx context.Context, c *Caller, m Method, t Target, why string) {
	if !s.denials.allow(c.Identity + "\x00" + m.Action) {
		return
	}
	resource := "tenant/" + t.Tenant
	if t.Kind != "" {
		resource = t.Kind + "/" + t.ID
	}
	e := audit.Entry{TenantID: c.HomeTenant, Actor: c.Identity, Action: m.Action, Resource: resource, Outcome: "denied",
		RequestID: c.RequestID, Caller: c.Addr, Details: map[string]any{"reason": why}}
	err := s.deps.DB.Tx(ctx, func(tx *sql.Tx) error { return audit.Record(ctx, tx, s.deps.Clock.Now(), e) })
	if err != nil {
		s.deps.Log.Warn("record denial", "request_id", c.RequestID, "err", err)
	}
}

// idempotent runs the call under its Idempotency-Key (package
// idempotency): the first answer for the same (home tenant, identity, key)
// and body is replayed, the same key with another body is refused
// (CONFLICT), a 5xx answer is not kept, and the answer of a ShownOnce
// method is never stored (a replay answers CONFLICT and does not run).
func (s *Server) idempotent(ctx context.Context, c *Caller, m Method, key string, raw []byte, run func() answer) answer {
	ic := idempotency.Call{Tenant: c.HomeTenant, Identity: c.Identity, Key: key, Method: m.Name, Body: raw,
		ShownOnce: m.shownOnce, RequestID: c.RequestID}
	a, err := s.idem.Run(ctx, ic, func() idempotency.Answer {
		a := run()
		return idempotency.Answer{Status: a.status, Body: a.body}
	})
	if err != nil {
		return s.errorAnswer(c.RequestID, err)
	}
	return answer{status: a.Status, body: a.Body}
}
