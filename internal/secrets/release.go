package secrets

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
)

// LiveCommands is what the broker asks the commands module: command
// commandID if it is addressed to nodeID and live (queued, sent or
// running, and unexpired at now). ok is false when there is no such
// command.
type LiveCommands interface {
	LiveCommand(ctx context.Context, nodeID, commandID string, now time.Time) (c LiveCommand, ok bool, err error)
}

// LiveCommand is what the broker reads of a live command: its tenant (its
// node's), its kind, its payload, and its subject tenant, the tenant the
// work is for when a module runs it on a fleet host for a tenant (a
// sandbox's tenant for sandbox.create and sandbox.update; "" otherwise).
type LiveCommand struct {
	Tenant  string
	Subject string
	Kind    string
	Payload []byte
}

// The kinds whose subject tenant's secrets the broker releases to a fleet
// host: the sandbox commands that carry a template's environment, and an
// exec that names the env references its host may fetch again after a
// restart.
const (
	kindSandboxCreate = "sandbox.create"
	kindSandboxUpdate = "sandbox.update"
	kindSandboxExec   = "sandbox.exec"
)

// requestFacts is what the broker knows of a request before it decides
// whether the request itself is good: who asked, what they signed, the
// record of the certificate they signed with, and the time.
type requestFacts struct {
	Session   pki.NodeIdentity          // what the session is authenticated as
	Body      *nodev1.SecretRequestBody // nil when the body did not parse
	RawBody   []byte                    // the signed bytes of Body
	Sig       []byte                    // the node's signature over RawBody
	Cert      nodes.CertState           // the record of the signing certificate
	CertKnown bool                      // false when no record was found
	Now       time.Time
}

// checkRequest decides whether a request is well formed, fresh and signed
// by the session's node with its current platform certificate. It returns
// the request's one-time key, or the reason for a refusal. It reads
// nothing and calls no clock.
func checkRequest(f requestFacts) (*ecdsa.PublicKey, string) {
	body, cert := f.Body, f.Cert
	if body == nil {
		return nil, "body-malformed"
	}
	if body.NodeId != f.Session.NodeID {
		return nil, "wrong-node"
	}
	switch {
	case !f.CertKnown || cert.NodeID != f.Session.NodeID:
		return nil, "cert-unknown"
	case cert.Revoked:
		return nil, "cert-revoked"
	case cert.Role == pki.RoleNodeTenant:
		return nil, "node-tenant"
	case cert.Role != pki.RoleNode:
		return nil, "role-not-allowed"
	case cert.Serial != f.Session.Serial || f.Now.After(cert.NotAfter):
		return nil, "cert-not-current"
	}
	if cert.Cert == nil || !wire.VerifyNode(cert.Cert.PublicKey, wire.SecretRequestSigContext, f.RawBody, f.Sig) {
		return nil, "bad-signature"
	}
	if t := time.UnixMilli(body.TimeMs); t.Before(f.Now.Add(-ReleaseLifetime)) || t.After(f.Now.Add(ReleaseLifetime)) {
		return nil, "stale"
	}
	if len(body.RequestId) < 16 || len(body.RequestId) > 64 {
		return nil, "request-id-invalid"
	}
	otk, err := x509.ParsePKIXPublicKey(body.OneTimeKey)
	ecKey, isEC := otk.(*ecdsa.PublicKey)
	if err != nil || !isEC {
		return nil, "one-time-key-invalid"
	}
	return ecKey, ""
}

// grantFacts is what the broker knows, for a good request, of the work it
// names: the command, the node's tenant, the secret and its tenant's state.
type grantFacts struct {
	Ref            string // the reference asked for
	CommandLive    bool   // a live command addressed to the node has the request's id
	CommandTenant  string
	CommandPayload []byte
	// CommandSubject and CommandKind are the command's subject tenant and
	// kind (LiveCommand).
	CommandSubject string
	CommandKind    string
	NodeTenant     string
	NodeKnown      bool
	SecretFound    bool   // the reference's tenant holds a live version of it
	SecretScope    string // its scope (ScopeTenant or ScopeFleet)
	TenantState    string // iam.EffectiveState of the reference's tenant
	ChainErr       error  // reading the tenant's chain failed
}

// checkGrant decides whether a good request may have its secret: the
// command must name the reference, and the secret, the command and the
// node must all be one tenant's, which is neither suspended nor deleted.
// It returns the secret's tenant, or the reason for a refusal; err is
// ChainErr when the decision needed the tenant's state and it could not be
// read. It reads nothing.
func checkGrant(g grantFacts) (tenant, reason string, err error) {
	if g.CommandLive && g.CommandSubject != "" {
		return checkSubjectGrant(g)
	}
	if !g.CommandLive || !payloadNames(g.CommandPayload, g.Ref) {
		return "", "not-bound", nil
	}
	tenant, _, ok := ParseRef(g.Ref)
	if !ok {
		return "", "unknown-ref", nil
	}
	if !g.NodeKnown {
		return "", "node-unknown", nil
	}
	// A secret goes only to its own tenant's work on its own tenant's
	// node: a fleet secret (root) only to root work on a root node, and
	// one tenant's secret never to another tenant's command or machine,
	// whatever a command's payload names.
	if !TenantsMatch(tenant, g.CommandTenant, g.NodeTenant) {
		return "", "tenant-mismatch", nil
	}
	if !g.SecretFound {
		return "", "unknown-ref", nil
	}
	return releasedTo(g, tenant)
}

// releasedTo ends a grant's decision for tenant's secret: an error
// reading the tenant's chain fails it, and a suspended or deleted tenant
// is refused.
func releasedTo(g grantFacts, tenant string) (string, string, error) {
	if g.ChainErr != nil {
		return "", "", g.ChainErr
	}
	switch g.TenantState {
	case iam.StateSuspended:
		return "", "tenant-suspended", nil
	case iam.StateDeleted:
		return "", "tenant-deleted", nil
	}
	return tenant, "", nil
}

// checkSubjectGrant decides a request for a live command a module runs on
// a fleet host for a subject tenant (a sandbox's create or claim): the
// command must be sandbox.create or sandbox.update and name the
// reference as one of its env values; the node and the command must be
// one tenant's (the fleet host's), and the secret must be a tenant-scoped
// secret of the subject tenant, never a fleet secret and never another
// tenant's; the subject tenant must be neither suspended nor deleted.
func checkSubjectGrant(g grantFacts) (tenant, reason string, err error) {
	if keyTenant, sandbox, ok := spec.ParseEnvKeyRef(g.Ref); ok {
		return checkEnvKeyGrant(g, keyTenant, sandbox)
	}
	if !envNames(g.CommandKind, g.CommandPayload, g.Ref) {
		return "", "not-bound", nil
	}
	tenant, _, ok := ParseRef(g.Ref)
	if !ok {
		return "", "unknown-ref", nil
	}
	if !g.NodeKnown {
		return "", "node-unknown", nil
	}
	if tenant != g.CommandSubject || !fleetHost(g) {
		return "", "tenant-mismatch", nil
	}
	if !g.SecretFound || g.SecretScope != ScopeTenant {
		return "", "unknown-ref", nil
	}
	return releasedTo(g, tenant)
}

// sandboxPayload is what the broker reads of a sandbox command's payload.
type sandboxPayload struct {
	SandboxID string            `json:"sandbox_id"`
	Env       map[string]string `json:"env"`
	EnvRefs   []string          `json:"env_refs"`
}

// envNames reports whether a sandbox command of kind names ref: a
// create's or update's "env" object has it as one of its values
// (exactly: a reference inside a longer value is not one), an exec's
// "env_refs" list holds it. Any other kind names nothing.
func envNames(kind string, payload []byte, ref string) bool {
	var p sandboxPayload
	if json.Unmarshal(payload, &p) != nil {
		return false
	}
	switch kind {
	case kindSandboxCreate, kindSandboxUpdate:
		for _, v := range p.Env {
			if v == ref {
				return true
			}
		}
	case kindSandboxExec:
		return slices.Contains(p.EnvRefs, ref)
	}
	return false
}

// checkEnvKeyGrant decides a request for sandbox's env data key of
// tenant (spec.EnvKeyRef): the live subject command must be about that
// very sandbox and need the key (a create or update whose env holds a
// value sealed for tenant, or an exec naming the reference in its
// env_refs); the node and the command must be one tenant's, and tenant
// must be the command's subject, neither suspended nor deleted.
func checkEnvKeyGrant(g grantFacts, tenant, sandbox string) (string, string, error) {
	var p sandboxPayload
	if json.Unmarshal(g.CommandPayload, &p) != nil || p.SandboxID != sandbox || !needsEnvKey(g.CommandKind, p, g.Ref, tenant) {
		return "", "not-bound", nil
	}
	if !g.NodeKnown {
		return "", "node-unknown", nil
	}
	if tenant != g.CommandSubject || !fleetHost(g) {
		return "", "tenant-mismatch", nil
	}
	return releasedTo(g, tenant)
}

// fleetHost reports whether a subject command and its node are both the
// fleet's (the root tenant's): a tenant's secret or env key goes to a
// host for a subject tenant only when the host is a fleet host, whatever
// the module that placed the command decided.
func fleetHost(g grantFacts) bool {
	return g.CommandTenant == iam.RootTenant && g.NodeTenant == iam.RootTenant
}

// needsEnvKey reports whether a sandbox command of kind with payload p
// needs the env key ref of tenant.
func needsEnvKey(kind string, p sandboxPayload, ref, tenant string) bool {
	switch kind {
	case kindSandboxCreate, kindSandboxUpdate:
		for _, v := range p.Env {
			if t, ok := spec.SealedEnvTenant(v); ok && t == tenant {
				return true
			}
		}
	case kindSandboxExec:
		return slices.Contains(p.EnvRefs, ref)
	}
	return false
}

// payloadNames reports whether a command payload's "ref" field is ref.
func payloadNames(payload []byte, ref string) bool {
	var p struct {
		Ref string `json:"ref"`
	}
	return json.Unmarshal(payload, &p) == nil && p.Ref == ref
}

// TenantsMatch reports whether a secret of secretTenant may be released
// for a command of commandTenant on a node of nodeTenant: only when all
// three are the same tenant.
func TenantsMatch(secretTenant, commandTenant, nodeTenant string) bool {
	return secretTenant != "" && secretTenant == commandTenant && secretTenant == nodeTenant
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
	now := s.clk.Now()
	f := s.readRequest(ctx, id, req, now)
	if f.Body == nil {
		return "", s.refused(ctx, "body-malformed", id.NodeID, nil)
	}
	body := f.Body
	d := map[string]any{"ref": body.Ref, "request_id": body.RequestId, "command_id": body.CommandId}
	otk, reason := checkRequest(f)
	if reason != "" {
		return "", s.refused(ctx, reason, id.NodeID, d)
	}
	g, sec := s.readGrant(ctx, id.NodeID, body, now)
	tenant, reason, err := checkGrant(g)
	if err != nil {
		return "", err
	}
	if reason != "" {
		if reason == "tenant-mismatch" {
			d["command_tenant"], d["node_tenant"] = g.CommandTenant, g.NodeTenant
		}
		return "", s.refused(ctx, reason, id.NodeID, d)
	}
	compact, reason, err := s.seal(otk, body, tenant, sec, now)
	if reason != "" {
		return "", s.refused(ctx, reason, id.NodeID, d)
	}
	if err != nil {
		return "", err
	}
	err = s.spend(ctx, id.NodeID, body, tenant, sec.version, now)
	if errors.Is(err, errReplayed) {
		return "", s.refused(ctx, "replayed", id.NodeID, d)
	}
	if err != nil {
		return "", err
	}
	return compact, nil
}

// readRequest parses a request's body and reads the record of the
// certificate it names (when the body parses).
func (s *Service) readRequest(ctx context.Context, id pki.NodeIdentity, req *nodev1.SecretRequest, now time.Time) requestFacts {
	f := requestFacts{Session: id, RawBody: req.GetBody(), Sig: req.GetNodeSig(), Now: now}
	var body nodev1.SecretRequestBody
	if err := proto.Unmarshal(req.GetBody(), &body); err != nil {
		return f
	}
	f.Body = &body
	cert, err := s.nodes.CertState(ctx, req.GetCertSerial())
	f.Cert, f.CertKnown = cert, err == nil
	return f
}

// sealedSecret is a secret's latest live version as stored.
type sealedSecret struct {
	version int64
	sealed  []byte
}

// readGrant reads what checkGrant decides on: the live command the body
// names, the node's tenant, the secret's latest live version and its
// tenant's state.
func (s *Service) readGrant(ctx context.Context, nodeID string, body *nodev1.SecretRequestBody, now time.Time) (grantFacts, sealedSecret) {
	g := grantFacts{Ref: body.Ref}
	live, ok, err := s.cmds.LiveCommand(ctx, nodeID, body.CommandId, now)
	if err != nil {
		s.log.Warn("read the command of a secret request", "err", err)
		ok = false
	}
	g.CommandLive = ok
	g.CommandTenant, g.CommandPayload, g.CommandSubject, g.CommandKind = live.Tenant, live.Payload, live.Subject, live.Kind
	nodeTenant, err := s.nodes.TenantOf(ctx, nodeID)
	g.NodeTenant, g.NodeKnown = nodeTenant, err == nil
	var sec sealedSecret
	if keyTenant, _, isKey := spec.ParseEnvKeyRef(body.Ref); isKey {
		g.TenantState, g.ChainErr = s.tenantState(ctx, keyTenant)
		return g, sec
	}
	tenant, _, ok := ParseRef(body.Ref)
	if !ok {
		return g, sec
	}
	err = s.db.QueryRowContext(ctx, sqlSealedLatest, body.Ref, tenant).Scan(&sec.version, &sec.sealed, &g.SecretScope)
	g.SecretFound = err == nil
	if !g.SecretFound {
		return g, sec
	}
	g.TenantState, g.ChainErr = s.tenantState(ctx, tenant)
	return g, sec
}

// tenantState reads tenant's effective state (iam.EffectiveState).
func (s *Service) tenantState(ctx context.Context, tenant string) (string, error) {
	chain, err := s.iam.Chain(ctx, tenant)
	if err != nil {
		return "", err
	}
	return iam.EffectiveState(chain), nil
}

// seal opens the stored value and seals it, as a wire.SecretRelease, to
// the request's one-time key. A value that does not open is refused as
// "seal-broken".
func (s *Service) seal(otk *ecdsa.PublicKey, body *nodev1.SecretRequestBody, tenant string, sec sealedSecret, now time.Time) (compact, reason string, err error) {
	value, err := s.value(body.Ref, tenant, sec)
	if err != nil {
		return "", "seal-broken", nil
	}
	exp := now.Add(ReleaseLifetime)
	payload, _ := json.Marshal(wire.SecretRelease{Ref: body.Ref, Version: sec.version, Value: base64.StdEncoding.EncodeToString(value),
		Exp: exp.Unix(), Request: body.RequestId})
	clear(value)
	enc, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{Algorithm: jose.ECDH_ES_A256KW, Key: otk},
		(&jose.EncrypterOptions{}).WithType(wire.SecretReleaseType).WithHeader("exp", exp.Unix()))
	if err != nil {
		return "", "", fmt.Errorf("secrets: encrypter: %w", err)
	}
	obj, err := enc.Encrypt(payload)
	clear(payload)
	if err != nil {
		return "", "", fmt.Errorf("secrets: encrypt: %w", err)
	}
	compact, err = obj.CompactSerialize()
	if err != nil {
		return "", "", fmt.Errorf("secrets: serialize: %w", err)
	}
	return compact, "", nil
}

// value is what a granted request releases: a secret's stored value
// opened, or for an env key reference (spec.EnvKeyRef) the sandbox's env
// data key, derived from the key-encryption key and never stored.
func (s *Service) value(ref, tenant string, sec sealedSecret) ([]byte, error) {
	if keyTenant, sandbox, ok := spec.ParseEnvKeyRef(ref); ok {
		k := spec.EnvDataKey(spec.EnvKey(s.kek), keyTenant, sandbox)
		return k[:], nil
	}
	value, err := pki.Open(s.kek, sec.sealed, aad(ref, tenant, sec.version))
	if err != nil {
		return nil, fmt.Errorf("secrets: open: %w", err)
	}
	return value, nil
}

// spend spends the request id and audits the release in one transaction;
// a request id seen before is errReplayed.
func (s *Service) spend(ctx context.Context, nodeID string, body *nodev1.SecretRequestBody, tenant string, version int64, now time.Time) error {
	return s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, sqlSpendRequest, body.RequestId, nodeID, now.UnixMilli()); err != nil {
			if store.IsUniqueViolation(err) {
				return errReplayed
			}
			return fmt.Errorf("secrets: spend request id: %w", err)
		}
		return audit.Record(ctx, tx, now, audit.Entry{TenantID: tenant, Actor: "node/" + nodeID, Action: "compute:secrets:release",
			Resource: body.Ref, Outcome: "allowed", Details: map[string]any{"version": version, "command_id": body.CommandId, "request_id": body.RequestId}})
	})
}

var errReplayed = errors.New("replayed")
