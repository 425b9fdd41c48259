// Package client is the Go client of the Better Compute public API. The CLI
// and the tests use it; errors come back as *Error with the server's code.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/secretfile"
)

// MaxAnswerBytes bounds an answer the client reads. The largest is
// sandboxes.exec's: two 8 MiB streams, base64 in JSON (about 21.4 MiB).
const MaxAnswerBytes = 32 << 20

// Error is an error answer from the API. Test for a code with errors.Is
// against the Err* values (errors.Is(err, client.ErrAccessDenied)) or read
// Code.
type Error struct {
	Status    int
	Code      string
	Message   string
	RequestID string
	// RetryAfter is set on RATE_LIMITED answers.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (request %s)", e.Code, e.Message, e.RequestID)
}

// Is matches another *Error by code alone, so errors.Is(err, ErrNotFound)
// works for any NOT_FOUND answer.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Status == 0 && t.RequestID == ""
}

// The API's error codes as errors for errors.Is.
var (
	ErrAccessDenied      = &Error{Code: "ACCESS_DENIED"}
	ErrUnauthenticated   = &Error{Code: "UNAUTHENTICATED"}
	ErrInvalidInput      = &Error{Code: "INVALID_INPUT"}
	ErrInvalidState      = &Error{Code: "INVALID_STATE"}
	ErrNotFound          = &Error{Code: "NOT_FOUND"}
	ErrConflict          = &Error{Code: "CONFLICT"}
	ErrRateLimited       = &Error{Code: "RATE_LIMITED"}
	ErrResourceExhausted = &Error{Code: "RESOURCE_EXHAUSTED"}
	ErrPayloadTooLarge   = &Error{Code: "PAYLOAD_TOO_LARGE"}
	ErrCSRFRejected      = &Error{Code: "CSRF_REJECTED"}
	ErrUntrustedOrigin   = &Error{Code: "UNTRUSTED_ORIGIN"}
	ErrTenantSuspended   = &Error{Code: "TENANT_SUSPENDED"}
	ErrUnavailable       = &Error{Code: "UNAVAILABLE"}
	ErrInternal          = &Error{Code: "INTERNAL_ERROR"}
	ErrApprovalRequired  = &Error{Code: "APPROVAL_REQUIRED"}
)

// CodeOf returns the API error code in err, or "" when err is not one.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Client calls one control plane with one API key.
type Client struct {
	BaseURL string
	key     string
	HTTP    *http.Client
	// Retry bounds the retries of RATE_LIMITED answers (retry.go).
	Retry Retry
}

// New returns a client for baseURL (e.g. http://127.0.0.1:7780) with key.
func New(baseURL, key string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), key: key, HTTP: &http.Client{Timeout: 60 * time.Second, CheckRedirect: noRedirects}, Retry: DefaultRetry}
}

// FromEnv builds a client from BC_ADDR and BC_API_KEY_FILE (or
// BC_API_KEY), verifying an https:// server against BC_CA_FILE (see
// FromEnvCA).
func FromEnv() (*Client, error) { return FromEnvCA("") }

// FromEnvCA is FromEnv trusting the CA at caFile (default BC_CA_FILE; see
// LoadRoots), enough only for a loopback http:// URL when both are "".
func FromEnvCA(caFile string) (*Client, error) {
	addr := os.Getenv("BC_ADDR")
	if addr == "" {
		return nil, errors.New("BC_ADDR is not set (run `. DATA/env` after `better-compute dev`)")
	}
	if err := CheckBaseURL(addr); err != nil {
		return nil, err
	}
	key := os.Getenv("BC_API_KEY")
	if f := os.Getenv("BC_API_KEY_FILE"); f != "" {
		// Refused when group or other may access it, as approver keys are.
		b, err := secretfile.Read("BC_API_KEY_FILE", f)
		if err != nil {
			return nil, err
		}
		if err := checkKeyFile(f, b); err != nil {
			return nil, err
		}
		key = strings.TrimSpace(string(b))
	}
	if key == "" {
		return nil, errors.New("set BC_API_KEY_FILE (or BC_API_KEY) to an API key")
	}
	return newFromEnv(addr, key, caFile)
}

// tenantIn names tenant as an input's tenant ("" for the caller's own).
func tenantIn(tenant string) apitypes.TenantIn { return apitypes.TenantIn{TenantID: tenant} }

// Call invokes method with in and decodes the answer into out (when not nil).
func (c *Client) Call(ctx context.Context, method string, in, out any) error {
	return c.CallIdempotent(ctx, method, "", in, out)
}

// CallIdempotent is Call with an Idempotency-Key (none when key is ""): the
// server replays the first answer for the same key and body. A
// RATE_LIMITED answer is retried after its Retry-After, within c.Retry.
func (c *Client) CallIdempotent(ctx context.Context, method, key string, in, out any) error {
	if in == nil {
		in = struct{}{}
	}
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("client: encode: %w", err)
	}
	return c.Retry.withRetry(ctx, func() error { return c.send(ctx, method, key, body, out) })
}

// send makes one request of method with body and decodes its answer.
func (c *Client) send(ctx context.Context, method, key string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+"/api/v1/"+method, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("client: request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Authorization", "Bearer "+c.key)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("client: %s: %w", method, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes))
	if err != nil {
		return fmt.Errorf("client: read answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var eb apitypes.ErrorBody
		if json.Unmarshal(raw, &eb) != nil || eb.Error.Code == "" {
			return &Error{Status: resp.StatusCode, Code: "INTERNAL_ERROR", Message: "unexpected answer " + resp.Status}
		}
		e := &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message, RequestID: eb.Error.RequestID}
		if ra, err := time.ParseDuration(resp.Header.Get("Retry-After") + "s"); err == nil {
			e.RetryAfter = ra
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("client: decode answer: %w", err)
	}
	return nil
}

// Node is a node as listed.
type Node = apitypes.Node

// Nodes lists the nodes the caller can see.
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	var out struct {
		Nodes []Node `json:"nodes"`
	}
	err := c.Call(ctx, "nodes.list", nil, &out)
	return out.Nodes, err
}

// JoinToken is a created join token; Token is shown once.
type JoinToken = apitypes.JoinToken

// CreateJoinToken makes a single-use join token.
func (c *Client) CreateJoinToken(ctx context.Context, role, name string, ttl time.Duration) (JoinToken, error) {
	var out JoinToken
	err := c.Call(ctx, "joinTokens.create", apitypes.JoinTokenIn{Role: role, Name: name, TTLSeconds: int64(ttl / time.Second)}, &out)
	return out, err
}

// Command is a command as the API shows it.
type Command = apitypes.Command

// CreateCommand queues a command for a node.
func (c *Client) CreateCommand(ctx context.Context, nodeID, kind string, payload json.RawMessage) (Command, error) {
	var out Command
	err := c.Call(ctx, "commands.create", apitypes.CommandIn{NodeID: nodeID, Kind: kind, Payload: payload}, &out)
	return out, err
}

// Command reads a command.
func (c *Client) Command(ctx context.Context, id string) (Command, error) {
	var out Command
	err := c.Call(ctx, "commands.get", apitypes.IDIn{ID: id}, &out)
	return out, err
}

// WaitCommand polls a command until it is final or ctx ends, calling
// progress (when not nil) on every state change.
func (c *Client) WaitCommand(ctx context.Context, id string, interval time.Duration, progress func(Command)) (Command, error) {
	last := ""
	for {
		cmd, err := c.Command(ctx, id)
		if err != nil {
			return cmd, err
		}
		if cmd.State != last && progress != nil {
			progress(cmd)
		}
		last = cmd.State
		if cmd.Terminal() {
			return cmd, nil
		}
		select {
		case <-ctx.Done():
			return cmd, ctx.Err()
		case <-time.After(interval):
		}
	}
}

// Tenant is a tenant.
type Tenant = apitypes.Tenant

// CreateTenant makes a tenant under parent ("" for the caller's tenant).
func (c *Client) CreateTenant(ctx context.Context, parent, name string) (Tenant, error) {
	var out Tenant
	err := c.Call(ctx, "tenants.create", apitypes.TenantCreateIn{ParentID: parent, Name: name}, &out)
	return out, err
}

// SetTenantState calls tenants.suspend, tenants.resume or tenants.delete.
func (c *Client) SetTenantState(ctx context.Context, id, verb string) (Tenant, error) {
	var out Tenant
	err := c.Call(ctx, "tenants."+verb, apitypes.IDIn{ID: id}, &out)
	return out, err
}

// Identity is a person or agent.
type Identity = apitypes.Identity

// CreateIdentity makes an identity in tenant.
func (c *Client) CreateIdentity(ctx context.Context, tenant, name, kind string) (Identity, error) {
	var out Identity
	err := c.Call(ctx, "identities.create", apitypes.IdentityCreateIn{TenantIn: tenantIn(tenant), Name: name, Kind: kind}, &out)
	return out, err
}

// Bind gives an identity a role in tenant.
func (c *Client) Bind(ctx context.Context, tenant, identity, role string) error {
	return c.Call(ctx, "bindings.create", apitypes.BindIn{TenantIn: tenantIn(tenant), IdentityID: identity, RoleID: role}, nil)
}

// Binding gives an identity a role in a tenant and every tenant below it.
type Binding = apitypes.Binding

// Bindings lists the bindings made in tenant ("" for the caller's) and in
// every tenant below it.
func (c *Client) Bindings(ctx context.Context, tenant string) ([]Binding, error) {
	var out struct {
		Bindings []Binding `json:"bindings"`
	}
	err := c.Call(ctx, "bindings.list", tenantIn(tenant), &out)
	return out.Bindings, err
}

// APIKey is a new key; Key is shown once. ExpiresAt is nil for a key
// that does not expire.
type APIKey = apitypes.APIKey

// CreateAPIKey makes a key for identity in tenant.
func (c *Client) CreateAPIKey(ctx context.Context, tenant, identity, name string, ttl time.Duration, scopes ...string) (APIKey, error) {
	var out APIKey
	err := c.Call(ctx, "apiKeys.create", apitypes.APIKeyCreateIn{TenantIn: tenantIn(tenant), IdentityID: identity, Name: name,
		TTLSeconds: int64(ttl / time.Second), Scopes: scopes}, &out)
	return out, err
}

// Session is a new browser session; Value goes into the Cookie named
// Cookie and is shown once.
type Session = apitypes.Session

// CreateSession makes a session for the caller: at most 12 h, and never
// past the expiry of the caller's own key.
func (c *Client) CreateSession(ctx context.Context) (Session, error) {
	var out Session
	err := c.Call(ctx, "sessions.create", nil, &out)
	return out, err
}

// RevokeSession revokes session id of tenant ("" for the caller's) and
// every session made from it.
func (c *Client) RevokeSession(ctx context.Context, tenant, id string) error {
	return c.Call(ctx, "sessions.revoke", apitypes.TenantIDIn{TenantIn: tenantIn(tenant), ID: id}, nil)
}

// Key returns the API key the client sends (for tests and tools that need
// to make raw requests with it).
func (c *Client) Key() string { return c.key }

// Attestation is a command's attested result as the API returns it: the
// exact bytes the node signed, the signature over SHA-256(Context ||
// SignedBody), and the node's certificate chain (PEM).
type Attestation = apitypes.Attestation

// CommandAttestation reads a command's attestation (INVALID_STATE when its
// result is not attested).
func (c *Client) CommandAttestation(ctx context.Context, id string) (Attestation, error) {
	var out Attestation
	err := c.Call(ctx, "commands.attestation", apitypes.IDIn{ID: id}, &out)
	return out, err
}

// noRedirects keeps a redirect's answer as the answer: the API never
// redirects, and following one would carry the Authorization header to
// wherever it points (net/http keeps it for the same host, on any scheme).
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
