// Package secrets is the sealed secret store and the broker that releases a
// value only to the node doing the work.
//
// Values are sealed with AES-256-GCM under the key-encryption key, which
// lives outside the database; the authenticated data binds each ciphertext
// to its reference, tenant and version, so a ciphertext moved to another
// row or tenant does not open. No method returns a value to an API caller.
// A node gets one from Release: for a reference a live command addressed to
// it carries, when the secret's tenant is the command's and the node's,
// with a fresh request signed by its current platform certificate, as a
// JWE to a key it made for that one request.
package secrets

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Scopes a put is decided on.
const (
	ScopeTenant = "tenant"
	ScopeFleet  = "fleet"
)

// EventRefused is published (rate limited per reason) for every refused
// secret request.
const EventRefused = "security.secret.refused"

// ReleaseLifetime bounds how long a released JWE is good for.
const ReleaseLifetime = 5 * time.Minute

// MaxValue bounds a secret's size.
const MaxValue = 32 << 10

// Service is the secrets module.
type Service struct {
	db     *store.DB
	clk    clock.Clock
	kek    pki.KEK
	iam    *iam.Service
	nodes  *nodes.Service
	cmds   LiveCommands
	events *audit.Events
	log    *slog.Logger
}

// New returns the secrets module. kek seals values; cmds answers which
// live command binds a request (the commands module).
func New(db *store.DB, clk clock.Clock, kek pki.KEK, i *iam.Service, n *nodes.Service, cmds LiveCommands, ev *audit.Events, log *slog.Logger) *Service {
	return &Service{db: db, clk: clk, kek: kek, iam: i, nodes: n, cmds: cmds, events: ev, log: log}
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// Ref renders the reference of a secret.
func Ref(tenant, name string) string { return "secret://" + tenant + "/" + name }

// ParseRef splits a reference into tenant and name.
func ParseRef(ref string) (tenant, name string, ok bool) {
	rest, ok := strings.CutPrefix(ref, "secret://")
	if !ok {
		return "", "", false
	}
	tenant, name, ok = strings.Cut(rest, "/")
	if !ok || tenant == "" || !nameRE.MatchString(name) || len(tenant) > 64 {
		return "", "", false
	}
	return tenant, name, true
}

func aad(ref, tenant string, version int64) []byte {
	return []byte(fmt.Sprintf("bc-secret-v1\x00%s\x00%s\x00%d", ref, tenant, version))
}

// Meta is what anyone may see of a secret: never its value.
type Meta struct {
	Ref       string    `json:"ref"`
	TenantID  string    `json:"tenant_id"`
	Name      string    `json:"name"`
	Version   int64     `json:"version"`
	Scope     string    `json:"scope"`
	CreatedBy string    `json:"created_by"`
	CreatedAt time.Time `json:"created_at"`
}

// Put stores a new version of tenant/name, sealed. scope is the scope the
// call was decided on: fleet only in the root tenant; a tenant-scoped put
// never changes a fleet secret (INVALID_STATE). The audit row carries the
// reference and version, never the value.
func (s *Service) Put(ctx context.Context, actor audit.Entry, tenant, name, scope string, value []byte) (Meta, error) {
	if !nameRE.MatchString(name) {
		return Meta{}, errs.New(errs.InvalidInput, "name: lowercase letters, digits, '.', '_' or '-', at most 63")
	}
	if scope == "" {
		scope = ScopeTenant
	}
	if scope != ScopeTenant && scope != ScopeFleet {
		return Meta{}, errs.New(errs.InvalidInput, "scope: tenant or fleet")
	}
	if scope == ScopeFleet && tenant != iam.RootTenant {
		return Meta{}, errs.New(errs.InvalidInput, "scope: fleet secrets live in the root tenant")
	}
	if len(value) == 0 || len(value) > MaxValue {
		return Meta{}, errs.New(errs.InvalidInput, "value: 1 byte to 32 KiB")
	}
	m := Meta{Ref: Ref(tenant, name), TenantID: tenant, Name: name, Scope: scope, CreatedBy: actor.Actor}
	now := s.clk.Now()
	m.CreatedAt = now.UTC()
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		if err := s.lockRef(ctx, tx, m.Ref); err != nil {
			return err
		}
		var prev int64
		var prevScope string
		err := tx.QueryRowContext(ctx, sqlLatestVersion, m.Ref).Scan(&prev, &prevScope)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("secrets: read versions: %w", err)
		}
		// The latest version's scope decides, deleted or not: a name the
		// fleet holds stays the fleet's until a fleet-scoped put.
		if prevScope == ScopeFleet && scope != ScopeFleet {
			return errs.New(errs.InvalidState, "a tenant-scoped put cannot change a fleet secret")
		}
		m.Version = prev + 1
		sealed, err := pki.Seal(s.kek, value, aad(m.Ref, tenant, m.Version))
		if err != nil {
			return fmt.Errorf("secrets: seal: %w", err)
		}
		if _, err := tx.ExecContext(ctx, sqlInsertVersion,
			m.Ref, m.Version, tenant, name, scope, sealed, actor.Actor, now.UnixMilli()); err != nil {
			if store.IsUniqueViolation(err) {
				// Not expected under lockRef; if another writer got past it,
				// the caller gets a clear answer, never a 500.
				return errs.New(errs.Conflict, "another put of this secret committed first; put it again")
			}
			return fmt.Errorf("secrets: insert: %w", err)
		}
		actor.TenantID = tenant
		actor.Action, actor.Resource, actor.Outcome = "compute:secrets:manage", m.Ref, "allowed"
		actor.Details = map[string]any{"op": "put", "version": m.Version, "scope": scope}
		return audit.Record(ctx, tx, now, actor)
	})
	return m, err
}

// putLockClass is the first key of the PostgreSQL advisory locks that
// serialise puts of one reference (the second is the reference's hash).
const putLockClass = 0x5ec2

// lockRef serialises writers of ref until tx ends, so that versions stay
// dense and concurrent puts all succeed. On PostgreSQL it takes a
// transaction-scoped advisory lock on the reference (a hash collision only
// serialises two references more than needed); on SQLite every write
// transaction is already serial (one connection, BEGIN IMMEDIATE).
func (s *Service) lockRef(ctx context.Context, tx *sql.Tx, ref string) error {
	if s.db.Dialect != store.Postgres {
		return nil
	}
	if _, err := tx.ExecContext(ctx, sqlLockRef, putLockClass, ref); err != nil {
		return fmt.Errorf("secrets: lock %s: %w", ref, err)
	}
	return nil
}

// Delete marks every version of ref deleted. A tenant-scoped delete never
// changes a fleet secret (INVALID_STATE).
func (s *Service) Delete(ctx context.Context, actor audit.Entry, ref, scope string) error {
	if scope == "" {
		scope = ScopeTenant
	}
	now := s.clk.Now()
	return s.db.Tx(ctx, func(tx *sql.Tx) error {
		if err := s.lockRef(ctx, tx, ref); err != nil {
			return err
		}
		var cur string
		if err := tx.QueryRowContext(ctx, sqlLiveScope, ref).Scan(&cur); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return errs.New(errs.NotFound, "secret not found")
			}
			return fmt.Errorf("secrets: read: %w", err)
		}
		if cur == ScopeFleet && scope != ScopeFleet {
			return errs.New(errs.InvalidState, "a tenant-scoped delete cannot change a fleet secret")
		}
		if _, err := tx.ExecContext(ctx, sqlDeleteRef, now.UnixMilli(), ref); err != nil {
			return fmt.Errorf("secrets: delete: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:secrets:manage", ref, "allowed"
		actor.Details = map[string]any{"op": "delete", "scope": scope}
		return audit.Record(ctx, tx, now, actor)
	})
}

// List returns the metadata of tenant's live secrets (latest versions).
func (s *Service) List(ctx context.Context, tenant string) ([]Meta, error) {
	rows, err := s.db.QueryContext(ctx, sqlListLatest, tenant)
	if err != nil {
		return nil, fmt.Errorf("secrets: list: %w", err)
	}
	defer rows.Close()
	out := []Meta{}
	for rows.Next() {
		m, err := scanMeta(rows)
		if err != nil {
			return nil, fmt.Errorf("secrets: scan: %w", err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// Show returns one secret's metadata (its latest live version).
func (s *Service) Show(ctx context.Context, ref string) (Meta, error) {
	if _, _, ok := ParseRef(ref); !ok {
		return Meta{}, errs.New(errs.NotFound, "secret not found")
	}
	m, err := scanMeta(s.db.QueryRowContext(ctx, sqlShowLatest, ref))
	if errors.Is(err, sql.ErrNoRows) {
		return Meta{}, errs.New(errs.NotFound, "secret not found")
	}
	if err != nil {
		return Meta{}, fmt.Errorf("secrets: show: %w", err)
	}
	return m, nil
}

// TenantOf resolves a reference's tenant for the API envelope from the
// reference alone, reading nothing: a reference of another tenant, whether
// that tenant or secret exists or not, costs the same parse and is denied
// by the tenant check before any database read, so the answer and the
// work never tell which tenants hold secrets. A malformed reference is
// NOT_FOUND.
func (s *Service) TenantOf(_ context.Context, ref string) (string, error) {
	tenant, _, ok := ParseRef(ref)
	if !ok {
		return "", errs.New(errs.NotFound, "secret not found")
	}
	return tenant, nil
}
