package previews

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previewtoken"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// Bounds of a preview URL's lifetime.
const (
	// DefaultTTL is a preview URL's lifetime when the caller names none.
	DefaultTTL = time.Hour
	// MinTTL and MaxTTL bound the lifetime a caller may ask for; the URL
	// never outlives the sandbox's current deadline either.
	MinTTL = time.Minute
	MaxTTL = 24 * time.Hour
)

// Sandboxes finds a sandbox a scope sees as it is recorded
// (sandboxes.Service): the proxy's check of each request.
type Sandboxes interface {
	Get(ctx context.Context, scope iam.Scope, id string) (sandboxes.Sandbox, error)
}

// SettledSandboxes also finds a sandbox once its host has applied a
// pending warm claim (sandboxes.Service.GetSettled): a URL is issued only
// for a sandbox handed to its tenant.
type SettledSandboxes interface {
	Sandboxes
	GetSettled(ctx context.Context, scope iam.Scope, id string) (sandboxes.Sandbox, error)
}

// Service issues preview URLs and rotates the preview key.
type Service struct {
	db   *store.DB
	keys *Keys
	sbx  SettledSandboxes
	clk  clock.Clock
	base func() string
}

// New returns the previews module; base returns the preview proxy's
// public base URL ("" when this deployment serves no previews).
func New(db *store.DB, keys *Keys, sbx SettledSandboxes, clk clock.Clock, base func() string) *Service {
	return &Service{db: db, keys: keys, sbx: sbx, clk: clk, base: base}
}

// Keys is the module's preview key store.
func (s *Service) Keys() *Keys { return s.keys }

// Preview is what sandboxes.preview answers. URL carries the token: it is
// a bearer credential, shown once and never recorded.
type Preview struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
	SandboxID string    `json:"sandbox_id"`
	Port      int       `json:"port"`
}

// Issue makes a preview URL of port in sandbox id for actor, who sees it
// through scope (the API envelope decided compute:sandboxes:preview on
// it): a sandbox the scope cannot see is NOT_FOUND, one not running
// INVALID_STATE. ttl 0 is DefaultTTL; it is clamped to the sandbox's
// deadline. The issue is an audit row (the port, the expiry and the key
// id; never the token).
func (s *Service) Issue(ctx context.Context, actor audit.Entry, scope iam.Scope, id string, port int, ttl time.Duration) (Preview, error) {
	if port < 1 || port > 65535 {
		return Preview{}, errs.New(errs.InvalidInput, "port: 1 to 65535")
	}
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if ttl < MinTTL || ttl > MaxTTL {
		return Preview{}, errs.New(errs.InvalidInput, "ttl_seconds: 60 to 86400 (0: 3600)")
	}
	base := s.base()
	if base == "" {
		return Preview{}, errs.New(errs.Unavailable, "this deployment serves no previews: run serve with the preview role and set its public URL")
	}
	x, err := s.sbx.GetSettled(ctx, scope, id)
	if err != nil {
		return Preview{}, err
	}
	now := s.clk.Now()
	if x.State != sandboxes.StateRunning || !now.Before(x.ExpiresAt) {
		return Preview{}, errs.New(errs.InvalidState, "the sandbox is "+string(x.State))
	}
	exp := now.Add(ttl)
	if x.ExpiresAt.Before(exp) {
		exp = x.ExpiresAt
	}
	key, err := s.keys.Signing(ctx)
	if err != nil {
		return Preview{}, errs.Wrap(errs.Unavailable, "the preview key is not usable now", err)
	}
	tok, err := previewtoken.Issue(key, previewtoken.Claims{SandboxID: x.ID, Port: uint16(port), Expires: exp, TenantID: x.TenantID}, now, MaxTTL)
	if err != nil {
		return Preview{}, errs.Wrap(errs.InvalidInput, "the preview cannot be issued", err)
	}
	actor.TenantID, actor.Action, actor.Resource, actor.Outcome = x.TenantID, tickets.ActionSandboxPreview, "sandbox/"+x.ID, "allowed"
	actor.Details = map[string]any{"port": port, "expires_at_ms": exp.UnixMilli(), "kid": key.ID()}
	if err := s.db.Tx(ctx, func(tx *sql.Tx) error { return audit.Record(ctx, tx, now, actor) }); err != nil {
		return Preview{}, err
	}
	return Preview{URL: URL(base, x.ID, uint16(port), tok), ExpiresAt: exp.UTC(), SandboxID: x.ID, Port: port}, nil
}

// URL is the preview URL of token for port in sandbox under base.
func URL(base, sandboxID string, port uint16, token string) string {
	u, err := url.Parse(base)
	if err != nil {
		return base + Prefix(sandboxID, port, token) + "/"
	}
	u.Path = u.Path + Prefix(sandboxID, port, token) + "/"
	return u.String()
}

// Prefix is the path of a preview before the sandbox's own path.
func Prefix(sandboxID string, port uint16, token string) string {
	return "/p/" + sandboxID + "/" + strconv.Itoa(int(port)) + "/" + token
}

// RotateKey replaces the preview key (previews.rotateKey, decided on the
// root tenant) and records it; every URL issued before stops working.
func (s *Service) RotateKey(ctx context.Context, actor audit.Entry) (string, error) {
	if _, err := s.keys.read(ctx); err != nil {
		return "", err
	}
	fresh, err := s.keys.newRow()
	if err != nil {
		return "", err
	}
	now := s.clk.Now()
	actor.TenantID, actor.Action, actor.Resource, actor.Outcome = iam.RootTenant, ActionRotateKey, "preview-key/"+fresh.kid, "allowed"
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, sqlRotateKey, slotCurrent, fresh.kid, fresh.sealed, fresh.public, now.UnixMilli()); err != nil {
			return fmt.Errorf("previews: rotate key: %w", err)
		}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return "", err
	}
	return fresh.kid, nil
}

// ActionRotateKey is the IAM action of previews.rotateKey.
const ActionRotateKey = "compute:previews:rotate-key"
