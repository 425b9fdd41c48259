// Package api is the public HTTP API: POST /api/v1/<service>.<method> with a
// JSON object body. Every method goes through one envelope (method and
// CSRF checks, size limit, strict decoding, authentication, tenant
// pre-check, error shaping) before its handler runs; no method can skip it
// because handlers are only reachable through the registry.
package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"

	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
)

// MaxBody bounds a request body.
const MaxBody = 64 << 10

// Caller is the authenticated caller of one request.
type Caller struct {
	apikeys.Principal
	RequestID string
	Addr      string
}

// Actor returns the audit entry prefilled with who is calling.
func (c *Caller) Actor() audit.Entry {
	return audit.Entry{TenantID: c.TenantID, Actor: c.Identity, RequestID: c.RequestID, Caller: c.Addr}
}

// Root reports whether the caller is in the root tenant.
func (c *Caller) Root() bool { return c.TenantID == "root" }

// Method is one API method.
type Method struct {
	// Name is "<service>.<method>".
	Name string
	// Action is decided for the caller, as compute:<resource>:<verb>.
	Action string
	// Mutates marks methods that change state.
	Mutates bool
	// Handle decodes in (already checked to be one JSON object) and runs.
	Handle func(ctx context.Context, c *Caller, in json.RawMessage) (any, error)
}

// Authenticator checks a bearer key.
type Authenticator interface {
	Authenticate(ctx context.Context, key string) (apikeys.Principal, error)
}

// Server routes requests through the envelope to registered methods.
type Server struct {
	methods map[string]Method
	auth    Authenticator
	log     *slog.Logger
}

// NewServer returns an API server with no methods.
func NewServer(auth Authenticator, log *slog.Logger) *Server {
	return &Server{methods: map[string]Method{}, auth: auth, log: log}
}

// Register adds methods; a duplicate name panics at start-up.
func (s *Server) Register(ms ...Method) {
	for _, m := range ms {
		if _, dup := s.methods[m.Name]; dup {
			panic("api: method registered twice: " + m.Name)
		}
		s.methods[m.Name] = m
	}
}

var requestIDRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// ErrorBody is the JSON shape of every error answer.
type ErrorBody struct {
	Error struct {
		Code      errs.Code `json:"code"`
		Message   string    `json:"message"`
		RequestID string    `json:"request_id"`
	} `json:"error"`
}

// ServeHTTP is the envelope.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	rid := r.Header.Get("X-Request-Id")
	if !requestIDRE.MatchString(rid) {
		rid = ids.New("req_")
	}
	h.Set("X-Request-Id", rid)
	out, err := s.serve(r, rid)
	if err != nil {
		s.writeError(w, rid, err)
		return
	}
	h.Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

func (s *Server) writeError(w http.ResponseWriter, rid string, err error) {
	code := errs.CodeOf(err)
	if code == errs.Internal {
		s.log.Error("request failed", "request_id", rid, "err", err)
	} else {
		s.log.Info("request refused", "request_id", rid, "code", code, "err", err)
	}
	var body ErrorBody
	body.Error.Code, body.Error.Message, body.Error.RequestID = code, errs.SafeMessage(err), rid
	if code == errs.Internal {
		body.Error.Message = "internal error"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(errs.HTTPStatus(code))
	_ = json.NewEncoder(w).Encode(body)
}

func (s *Server) serve(r *http.Request, rid string) (any, error) {
	const prefix = "/api/v1/"
	if r.Method != http.MethodPost {
		return nil, errs.New(errs.InvalidInput, "only POST is accepted")
	}
	if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") || r.Header.Get("X-Better-Compute") != "1" {
		return nil, errs.New(errs.CSRFRejected, "content-type application/json and X-Better-Compute: 1 are required")
	}
	m, ok := s.methods[strings.TrimPrefix(r.URL.Path, prefix)]
	if !ok || !strings.HasPrefix(r.URL.Path, prefix) {
		return nil, errs.New(errs.NotFound, "no such method")
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil {
		return nil, errs.Wrap(errs.InvalidInput, "could not read the body", err)
	}
	if len(raw) > MaxBody {
		return nil, errs.New(errs.PayloadTooLarge, "body larger than 64 KiB")
	}
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' {
		return nil, errs.New(errs.InvalidInput, "body must be a JSON object")
	}
	authz := r.Header.Get("Authorization")
	key, ok := strings.CutPrefix(authz, "Bearer ")
	if !ok {
		return nil, apikeys.ErrInvalid
	}
	p, err := s.auth.Authenticate(r.Context(), key)
	if err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	c := &Caller{Principal: p, RequestID: rid, Addr: host}
	return m.Handle(r.Context(), c, raw)
}

// Decode strictly decodes a JSON object into v: unknown fields and trailing
// data are INVALID_INPUT naming what is wrong.
func Decode(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return errs.New(errs.InvalidInput, fmt.Sprintf("field %s: wrong type", ute.Field))
		}
		if strings.HasPrefix(err.Error(), "json: unknown field ") {
			return errs.New(errs.InvalidInput, "unknown field "+strings.TrimPrefix(err.Error(), "json: unknown field "))
		}
		return errs.New(errs.InvalidInput, "body is not valid JSON")
	}
	if dec.More() {
		return errs.New(errs.InvalidInput, "trailing data after the JSON object")
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); err != io.EOF {
		return errs.New(errs.InvalidInput, "trailing data after the JSON object")
	}
	return nil
}

// Handler adapts a typed handler to Method.Handle.
func Handler[In any](f func(ctx context.Context, c *Caller, in In) (any, error)) func(context.Context, *Caller, json.RawMessage) (any, error) {
	return func(ctx context.Context, c *Caller, raw json.RawMessage) (any, error) {
		var in In
		if err := Decode(raw, &in); err != nil {
			return nil, err
		}
		return f(ctx, c, in)
	}
}
