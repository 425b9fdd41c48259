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
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
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
	events *audit.Events
	log    *slog.Logger
}

// New returns the secrets module. kek seals values.
func New(db *store.DB, clk clock.Clock, kek pki.KEK, i *iam.Service, n *nodes.Service, ev *audit.Events, log *slog.Logger) *Service {
	return &Service{db: db, clk: clk, kek: kek, iam: i, nodes: n, events: ev, log: log}
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
		err := tx.QueryRowContext(ctx, `SELECT version, scope FROM secrets WHERE ref = $1 ORDER BY version DESC LIMIT 1`, m.Ref).Scan(&prev, &prevScope)
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
		if _, err := tx.ExecContext(ctx, `INSERT INTO secrets (ref, version, tenant_id, name, scope, sealed, created_by, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
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
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, putLockClass, ref); err != nil {
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
		if err := tx.QueryRowContext(ctx, `SELECT scope FROM secrets WHERE ref = $1 AND deleted_at IS NULL ORDER BY version DESC LIMIT 1`, ref).Scan(&cur); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return errs.New(errs.NotFound, "secret not found")
			}
			return fmt.Errorf("secrets: read: %w", err)
		}
		if cur == ScopeFleet && scope != ScopeFleet {
			return errs.New(errs.InvalidState, "a tenant-scoped delete cannot change a fleet secret")
		}
		if _, err := tx.ExecContext(ctx, `UPDATE secrets SET deleted_at = $1 WHERE ref = $2 AND deleted_at IS NULL`, now.UnixMilli(), ref); err != nil {
			return fmt.Errorf("secrets: delete: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:secrets:manage", ref, "allowed"
		actor.Details = map[string]any{"op": "delete", "scope": scope}
		return audit.Record(ctx, tx, now, actor)
	})
}

// List returns the metadata of tenant's live secrets (latest versions).
func (s *Service) List(ctx context.Context, tenant string) ([]Meta, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT ref, tenant_id, name, version, scope, created_by, created_at FROM secrets s
		WHERE tenant_id = $1 AND deleted_at IS NULL AND version = (SELECT MAX(version) FROM secrets x WHERE x.ref = s.ref) ORDER BY name`, tenant)
	if err != nil {
		return nil, fmt.Errorf("secrets: list: %w", err)
	}
	defer rows.Close()
	out := []Meta{}
	for rows.Next() {
		var m Meta
		var at int64
		if err := rows.Scan(&m.Ref, &m.TenantID, &m.Name, &m.Version, &m.Scope, &m.CreatedBy, &at); err != nil {
			return nil, fmt.Errorf("secrets: scan: %w", err)
		}
		m.CreatedAt = time.UnixMilli(at).UTC()
		out = append(out, m)
	}
	return out, rows.Err()
}

// Show returns one secret's metadata (its latest live version).
func (s *Service) Show(ctx context.Context, ref string) (Meta, error) {
	if _, _, ok := ParseRef(ref); !ok {
		return Meta{}, errs.New(errs.NotFound, "secret not found")
	}
	var m Meta
	var at int64
	err := s.db.QueryRowContext(ctx, `SELECT ref, tenant_id, name, version, scope, created_by, created_at FROM secrets
		WHERE ref = $1 AND deleted_at IS NULL ORDER BY version DESC LIMIT 1`, ref).Scan(&m.Ref, &m.TenantID, &m.Name, &m.Version, &m.Scope, &m.CreatedBy, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return Meta{}, errs.New(errs.NotFound, "secret not found")
	}
	if err != nil {
		return Meta{}, fmt.Errorf("secrets: show: %w", err)
	}
	m.CreatedAt = time.UnixMilli(at).UTC()
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

// refused records why a release was refused and returns the one generic
// answer a node sees.
func (s *Service) refused(ctx context.Context, reason, nodeID string, details map[string]any) error {
	if _, err := s.events.Refused(ctx, EventRefused, reason, nodeID, details); err != nil {
		s.log.Warn("record secret refusal", "reason", reason, "err", err)
	}
	return errs.New(errs.AccessDenied, "access denied")
}

// Release answers a node's secret request made on a session authenticated
// as id. Every refusal is one generic ACCESS_DENIED; the reason goes to
// security.secret.refused. A release is an audit row.
func (s *Service) Release(ctx context.Context, id pki.NodeIdentity, req *nodev1.SecretRequest) (string, error) {
	var body nodev1.SecretRequestBody
	if err := proto.Unmarshal(req.GetBody(), &body); err != nil {
		return "", s.refused(ctx, "body-malformed", id.NodeID, nil)
	}
	d := map[string]any{"ref": body.Ref, "request_id": body.RequestId, "command_id": body.CommandId}
	if body.NodeId != id.NodeID {
		return "", s.refused(ctx, "wrong-node", id.NodeID, d)
	}
	cert, err := s.nodes.CertState(ctx, req.GetCertSerial())
	switch {
	case err != nil || cert.NodeID != id.NodeID:
		return "", s.refused(ctx, "cert-unknown", id.NodeID, d)
	case cert.Revoked:
		return "", s.refused(ctx, "cert-revoked", id.NodeID, d)
	case cert.Role == pki.RoleNodeTenant:
		return "", s.refused(ctx, "node-tenant", id.NodeID, d)
	case cert.Role != pki.RoleNode:
		return "", s.refused(ctx, "role-not-allowed", id.NodeID, d)
	case cert.Serial != id.Serial || s.clk.Now().After(cert.NotAfter):
		return "", s.refused(ctx, "cert-not-current", id.NodeID, d)
	}
	pub, ok := cert.Cert.PublicKey.(*ecdsa.PublicKey)
	digest := sha256.Sum256(append([]byte(wire.SecretRequestSigContext), req.Body...))
	if !ok || !ecdsa.VerifyASN1(pub, digest[:], req.NodeSig) {
		return "", s.refused(ctx, "bad-signature", id.NodeID, d)
	}
	now := s.clk.Now()
	if t := time.UnixMilli(body.TimeMs); t.Before(now.Add(-ReleaseLifetime)) || t.After(now.Add(ReleaseLifetime)) {
		return "", s.refused(ctx, "stale", id.NodeID, d)
	}
	if len(body.RequestId) < 16 || len(body.RequestId) > 64 {
		return "", s.refused(ctx, "request-id-invalid", id.NodeID, d)
	}
	otk, err := x509.ParsePKIXPublicKey(body.OneTimeKey)
	ecKey, isEC := otk.(*ecdsa.PublicKey)
	if err != nil || !isEC {
		return "", s.refused(ctx, "one-time-key-invalid", id.NodeID, d)
	}
	commandTenant, ok := s.bound(ctx, id.NodeID, body.CommandId, body.Ref, now)
	if !ok {
		return "", s.refused(ctx, "not-bound", id.NodeID, d)
	}
	tenant, _, ok := ParseRef(body.Ref)
	if !ok {
		return "", s.refused(ctx, "unknown-ref", id.NodeID, d)
	}
	nodeTenant, err := s.nodes.TenantOf(ctx, id.NodeID)
	if err != nil {
		return "", s.refused(ctx, "node-unknown", id.NodeID, d)
	}
	// A secret goes only to its own tenant's work on its own tenant's
	// node: a fleet secret (root) only to root work on a root node, and
	// one tenant's secret never to another tenant's command or machine,
	// whatever a command's payload names.
	if !TenantsMatch(tenant, commandTenant, nodeTenant) {
		d["command_tenant"], d["node_tenant"] = commandTenant, nodeTenant
		return "", s.refused(ctx, "tenant-mismatch", id.NodeID, d)
	}
	var sealed []byte
	var version int64
	err = s.db.QueryRowContext(ctx, `SELECT version, sealed FROM secrets WHERE ref = $1 AND tenant_id = $2 AND deleted_at IS NULL ORDER BY version DESC LIMIT 1`,
		body.Ref, tenant).Scan(&version, &sealed)
	if err != nil {
		return "", s.refused(ctx, "unknown-ref", id.NodeID, d)
	}
	chain, err := s.iam.Chain(ctx, tenant)
	if err != nil {
		return "", err
	}
	switch st := iam.EffectiveState(chain); st {
	case iam.StateSuspended:
		return "", s.refused(ctx, "tenant-suspended", id.NodeID, d)
	case iam.StateDeleted:
		return "", s.refused(ctx, "tenant-deleted", id.NodeID, d)
	}
	value, err := pki.Open(s.kek, sealed, aad(body.Ref, tenant, version))
	if err != nil {
		return "", s.refused(ctx, "seal-broken", id.NodeID, d)
	}
	exp := now.Add(ReleaseLifetime)
	payload, _ := json.Marshal(struct {
		Ref     string `json:"ref"`
		Version int64  `json:"version"`
		Value   string `json:"value"`
		Exp     int64  `json:"exp"`
		Request string `json:"request_id"`
	}{body.Ref, version, base64.StdEncoding.EncodeToString(value), exp.Unix(), body.RequestId})
	clear(value)
	enc, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{Algorithm: jose.ECDH_ES_A256KW, Key: ecKey},
		(&jose.EncrypterOptions{}).WithType("bc-secret+jwe").WithHeader("exp", exp.Unix()))
	if err != nil {
		return "", fmt.Errorf("secrets: encrypter: %w", err)
	}
	obj, err := enc.Encrypt(payload)
	clear(payload)
	if err != nil {
		return "", fmt.Errorf("secrets: encrypt: %w", err)
	}
	compact, err := obj.CompactSerialize()
	if err != nil {
		return "", fmt.Errorf("secrets: serialize: %w", err)
	}
	// The request id is spent and the release audited in one transaction;
	// a request id seen before is a replay.
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO secret_requests (request_id, node_id, at) VALUES ($1, $2, $3)`, body.RequestId, id.NodeID, now.UnixMilli()); err != nil {
			if store.IsUniqueViolation(err) {
				return errReplayed
			}
			return fmt.Errorf("secrets: spend request id: %w", err)
		}
		return audit.Record(ctx, tx, now, audit.Entry{TenantID: tenant, Actor: "node/" + id.NodeID, Action: "compute:secrets:release",
			Resource: body.Ref, Outcome: "allowed", Details: map[string]any{"version": version, "command_id": body.CommandId, "request_id": body.RequestId}})
	})
	if errors.Is(err, errReplayed) {
		return "", s.refused(ctx, "replayed", id.NodeID, d)
	}
	if err != nil {
		return "", err
	}
	return compact, nil
}

var errReplayed = errors.New("replayed")

// TenantsMatch reports whether a secret of secretTenant may be released
// for a command of commandTenant on a node of nodeTenant: only when all
// three are the same tenant.
func TenantsMatch(secretTenant, commandTenant, nodeTenant string) bool {
	return secretTenant != "" && secretTenant == commandTenant && secretTenant == nodeTenant
}

// bound reports whether a live command addressed to nodeID carries ref in
// its payload's "ref" field, and that command's tenant.
func (s *Service) bound(ctx context.Context, nodeID, commandID, ref string, now time.Time) (string, bool) {
	var payload []byte
	var tenant string
	err := s.db.QueryRowContext(ctx, `SELECT payload, tenant_id FROM commands WHERE id = $1 AND node_id = $2 AND state IN ('queued', 'sent', 'running') AND expires_at > $3`,
		commandID, nodeID, now.UnixMilli()).Scan(&payload, &tenant)
	if err != nil {
		return "", false
	}
	var p struct {
		Ref string `json:"ref"`
	}
	if json.Unmarshal(payload, &p) != nil || p.Ref != ref {
		return "", false
	}
	return tenant, true
}
