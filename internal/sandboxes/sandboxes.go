// Package sandboxes is the control plane's sandbox module: images
// (content-addressed tars in an object store, named per tenant), templates
// (an image, limits, lifetimes, a network mode, environment, a warm pool
// size) and sandboxes, which it places on connected hosts whose bcd-set
// runtime labels advertise what the template needs, drives only through
// signed sandbox.* commands (whose payload is the whole spec the host
// enforces), tracks, extends within the template's maximum, and expires.
// Warm pools keep started, unclaimed sandboxes that hold no tenant
// environment until a create claims one.
package sandboxes

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"gocloud.dev/blob"

	"github.com/bettercompute/bettercompute/internal/afterreply"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/ratelimit"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
)

// State is a sandbox's state: one of the State constants.
type State string

// States of a sandbox. They are untyped so that the wire and API types,
// which carry them as strings, take them as they are.
const (
	StateStarting = "starting"
	StateWarm     = "warm"     // started, unclaimed, no tenant environment
	StateClaiming = "claiming" // a create was claiming it (rows of releases before claims were one transaction)
	StateRunning  = "running"
	StateDeleted  = "deleted"
	StateExpired  = "expired"
	StateFailed   = "failed"
)

// Live reports whether a sandbox in state s holds its host's resources.
func (s State) Live() bool {
	switch s {
	case StateStarting, StateWarm, StateClaiming, StateRunning:
		return true
	}
	return false
}

// Final reports whether state s is one a sandbox never leaves.
func (s State) Final() bool {
	switch s {
	case StateDeleted, StateExpired, StateFailed:
		return true
	}
	return false
}

// ExecRefuseWithin is how close to its expiry a sandbox refuses exec.
const ExecRefuseWithin = time.Minute

// StartTimeout bounds how long a create waits for its host.
const StartTimeout = 90 * time.Second

// CollectEvery is how often Run collects unreferenced objects.
const CollectEvery = 10 * time.Minute

// AdoptKillsPerMinute bounds the signed deletes one node's adopted
// reports can have queued a minute: a node (or a gateway replaying its
// signed reports) cannot grow the commands and audit tables, or fill the
// root tenant's in-flight quota, faster than that. A report past it is
// refused RESOURCE_EXHAUSTED (RATE_LIMITED is the API envelope's alone)
// and sent again by the node later.
const AdoptKillsPerMinute = 120

// TopicWarm wakes the warm pool reconciler.
const TopicWarm = "sandboxes.warm"

// NodeLister reads nodes and their certificates, and records refusals
// (the nodes module implements it).
type NodeLister interface {
	List(ctx context.Context, scope iam.Scope) ([]nodes.Node, error)
	// Connected returns which of ids hold a session now.
	Connected(ctx context.Context, ids []string) (map[string]bool, error)
	// CertState reads a certificate's record (nodes.ErrCertUnknown for
	// one never issued): a sandbox report's signature is checked with it.
	CertState(ctx context.Context, serial string) (nodes.CertState, error)
	// RecordRefusal records a refusal as a security event.
	RecordRefusal(ctx context.Context, typ, reason, nodeID string)
}

// Service is the sandboxes module.
type Service struct {
	db       *store.DB
	clk      clock.Clock
	bus      *bus.Bus
	commands *commands.Service
	nodes    NodeLister
	images   *blob.Bucket
	log      *slog.Logger
	// holdRefill stops the background refill (benchmarks measure claims
	// without refills queued on the same host).
	holdRefill atomic.Bool
	quotas     *quota.Service
	// adoptKills bounds the deletes adopted reports order, per node
	// (AdoptKillsPerMinute).
	adoptKills *ratelimit.PerKey
	// maxImage bounds an upload (0: spec.MaxImageBytes), and writing
	// holds the uploads a write streams into now.
	maxImage atomic.Int64
	writing  sync.Map
	// owners, when set, lets the purge drop deleted owners' checkpoints.
	owners Owners
	// purging runs one purge at a time in this process: a purge that
	// returns has removed every object it marked, whoever started first.
	purging sync.Mutex
	// kek seals templates' environments; secrets checks their references
	// (SetSecretEnv).
	kek     pki.KEK
	secrets Secrets
}

// HoldWarmRefill stops (true) or resumes the background warm-pool refill;
// ReconcileWarm still runs when called.
func (s *Service) HoldWarmRefill(hold bool) { s.holdRefill.Store(hold) }

// New returns the sandboxes module. images may be nil (image methods then
// answer INVALID_CONFIG). q admits templates' warm pools and sandboxes
// against the tenants' quotas; nil means quota.Defaults().
func New(db *store.DB, clk clock.Clock, b *bus.Bus, cmds *commands.Service, n NodeLister, q *quota.Service, images *blob.Bucket, log *slog.Logger) *Service {
	if q == nil {
		q = quota.New(db, clk, quota.Defaults())
	}
	return &Service{db: db, clk: clk, bus: b, commands: cmds, nodes: n, quotas: q, images: images, log: log,
		adoptKills: ratelimit.New(clk, AdoptKillsPerMinute, time.Minute)}
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

func validName(n string) bool { return nameRE.MatchString(n) }

// system is the actor of commands the module issues for a tenant's call:
// sandbox hosts are fleet nodes of the root tenant, so the command is the
// root tenant's, created on behalf of the caller named in its audit row.
func system(actor audit.Entry) audit.Entry {
	return audit.Entry{TenantID: iam.RootTenant, Actor: "sandboxes:" + actor.Actor, RequestID: actor.RequestID, Caller: actor.Caller}
}

// Template is a tenant's recipe for sandboxes.
type Template struct {
	ID          string            `json:"id"`
	TenantID    string            `json:"tenant_id"`
	Name        string            `json:"name"`
	Image       string            `json:"image"`
	ImageDigest string            `json:"image_digest"`
	Runtime     string            `json:"runtime"`
	Limits      spec.Limits       `json:"limits"`
	Lifetime    int64             `json:"lifetime_seconds"`
	MaxLifetime int64             `json:"max_lifetime_seconds"`
	Network     string            `json:"network"`
	Root        bool              `json:"root"`
	Env         map[string]string `json:"env"`
	Labels      map[string]string `json:"labels"`
	Warm        int               `json:"warm"`
	CreatedBy   string            `json:"created_by"`
	CreatedAt   time.Time         `json:"created_at"`

	// envCol is the env column as read (sealed), opened by templates.
	envCol string
}

// TemplateIn is what templates.create takes; zero fields get defaults.
type TemplateIn struct {
	Name        string            `json:"name"`
	Image       string            `json:"image"`
	Runtime     string            `json:"runtime"`
	Limits      spec.Limits       `json:"limits"`
	Lifetime    int64             `json:"lifetime_seconds"`
	MaxLifetime int64             `json:"max_lifetime_seconds"`
	Network     string            `json:"network"`
	Root        bool              `json:"root"`
	Env         map[string]string `json:"env"`
	Labels      map[string]string `json:"labels"`
	Warm        int               `json:"warm"`
}

// MaxWarm bounds a template's warm pool.
const MaxWarm = 32

// CreateTemplate validates and stores a template of tenant.
func (s *Service) CreateTemplate(ctx context.Context, actor audit.Entry, tenant string, in TemplateIn) (Template, error) {
	t, envJSON, labelsJSON, err := newTemplate(in, ids.New("tpl"), tenant, actor.Actor, s.clk.Now())
	if err != nil {
		return Template{}, err
	}
	if err := s.checkEnvSecrets(ctx, tenant, t.Env); err != nil {
		return Template{}, err
	}
	envCol, err := s.sealEnv(tenant, t.ID, envJSON)
	clear(envJSON)
	if err != nil {
		return Template{}, err
	}
	err = s.db.QueryRowContext(ctx, sqlImageDigest, tenant, t.Image).Scan(&t.ImageDigest)
	if errors.Is(err, sql.ErrNoRows) {
		return Template{}, errs.New(errs.InvalidInput, "image: no image of that name in the tenant")
	}
	if err != nil {
		return Template{}, fmt.Errorf("sandboxes: read image: %w", err)
	}
	now := s.clk.Now()
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if err := s.admitWarmPools(ctx, tx, tenant, int64(t.Warm)*t.Limits.MemoryMB); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, sqlInsertTemplate, templateArgs(t, envCol, labelsJSON, now)...)
		if store.IsUniqueViolation(err) {
			return errs.New(errs.Conflict, "a template of that name exists")
		}
		if err != nil {
			return fmt.Errorf("sandboxes: insert template: %w", err)
		}
		actor.TenantID, actor.Action, actor.Resource, actor.Outcome = tenant, "compute:templates:create", "template/"+t.ID, "allowed"
		actor.Details = map[string]any{"name": t.Name, "image_digest": t.ImageDigest, "runtime": t.Runtime, "warm": t.Warm, "secret_refs": EnvRefs(t.Env)}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return Template{}, err
	}
	s.bus.Publish(TopicWarm)
	return t, nil
}

func (s *Service) templates(ctx context.Context, where string, args ...any) ([]Template, error) {
	rows, err := s.db.QueryContext(ctx, sqlSelectTemplates+" "+where, args...)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: templates: %w", err)
	}
	defer rows.Close()
	out := []Template{}
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, err
		}
		if t.Env, err = s.openEnv(t.TenantID, t.ID, t.envCol); err != nil {
			return nil, err
		}
		t.envCol = ""
		out = append(out, t)
	}
	return out, rows.Err()
}

// ListTemplates returns the templates of the scope's tenant by name
// (templates are listed per tenant: the root tenant's scope lists its own).
func (s *Service) ListTemplates(ctx context.Context, scope iam.Scope) ([]Template, error) {
	return s.templates(ctx, whereTemplatesOf, scope.Tenant)
}

// Template returns a template of the scope's tenant by id or name;
// NOT_FOUND otherwise (the root tenant's scope finds its own only, as a
// name is unique only within a tenant).
func (s *Service) Template(ctx context.Context, scope iam.Scope, idOrName string) (Template, error) {
	ts, err := s.templates(ctx, whereTemplateRef, scope.Tenant, idOrName)
	if err != nil {
		return Template{}, err
	}
	if len(ts) != 1 {
		return Template{}, errs.New(errs.NotFound, "template not found")
	}
	return ts[0], nil
}

// TemplateTenantOf resolves a template's tenant.
func (s *Service) TemplateTenantOf(ctx context.Context, id string) (string, error) {
	var t string
	err := s.db.QueryRowContext(ctx, sqlTemplateTenant, id).Scan(&t)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errs.New(errs.NotFound, "template not found")
	}
	if err != nil {
		return "", fmt.Errorf("sandboxes: template tenant: %w", err)
	}
	return t, nil
}

// Sandbox is a sandbox as the API shows it.
type Sandbox struct {
	ID         string    `json:"id"`
	TenantID   string    `json:"tenant_id"`
	TemplateID string    `json:"template_id"`
	NodeID     string    `json:"node_id"`
	Runtime    string    `json:"runtime"`
	State      State     `json:"state"`
	Reason     string    `json:"reason,omitempty"`
	FromWarm   bool      `json:"from_warm"`
	CreatedBy  string    `json:"created_by"`
	CreatedAt  time.Time `json:"created_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	MaxExpires time.Time `json:"max_expires_at"`
	// FromCheckpoint is the checkpoint the sandbox was restored from.
	FromCheckpoint string `json:"from_checkpoint,omitempty"`

	memoryMB int64
	// claimCommand is the signed sandbox.update of a warm claim whose
	// host has not answered yet ('' once it has).
	claimCommand string
	// run is what the sandbox runs, as its create spec said: a
	// checkpoint records it, and a restore runs under it.
	run runsAs
}

// runsAs is what a sandbox's create spec fixed about what its guest runs.
type runsAs struct {
	image, network string
	root           bool
}

func (s *Service) sandboxes(ctx context.Context, where string, args ...any) ([]Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, sqlSelectSandboxes+" "+where, args...)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: list: %w", err)
	}
	defer rows.Close()
	out := []Sandbox{}
	for rows.Next() {
		x, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return out, rows.Err()
}

// ErrNotFound answers for a sandbox that does not exist in the caller's
// view (warm ones belong to no tenant and are never visible).
var ErrNotFound = errs.New(errs.NotFound, "sandbox not found")

// TenantOf resolves a sandbox's tenant for the envelope; an unclaimed
// (warm, starting warm, or being claimed) sandbox is NOT_FOUND, as one
// that does not exist.
func (s *Service) TenantOf(ctx context.Context, id string) (string, error) {
	xs, err := s.sandboxes(ctx, whereClaimedID, id, StateWarm, StateClaiming)
	if err != nil {
		return "", err
	}
	if len(xs) != 1 {
		return "", ErrNotFound
	}
	return xs[0].TenantID, nil
}

// Get returns a sandbox visible in scope.
func (s *Service) Get(ctx context.Context, scope iam.Scope, id string) (Sandbox, error) {
	xs, err := s.sandboxes(ctx, whereClaimedID, id, StateWarm, StateClaiming)
	if err != nil {
		return Sandbox{}, err
	}
	if len(xs) != 1 || !scope.Sees(xs[0].TenantID) {
		return Sandbox{}, ErrNotFound
	}
	return xs[0], nil
}

// List returns the sandboxes of the scope's tenant that are starting or
// running, newest first (sandboxes are listed per tenant: the root
// tenant's scope lists its own).
func (s *Service) List(ctx context.Context, scope iam.Scope) ([]Sandbox, error) {
	return s.sandboxes(ctx, whereListed, scope.Tenant, StateStarting, StateRunning)
}

// place loads the fleet and its hosts' load and picks a host for t
// (placeHost).
func (s *Service) place(ctx context.Context, t Template) (string, error) {
	ns, err := s.nodes.List(ctx, iam.RootScope())
	if err != nil {
		return "", err
	}
	load, err := s.hostLoads(ctx)
	if err != nil {
		return "", err
	}
	return placeHost(ns, load, t)
}

// hostLoads reads what each host's live sandboxes hold.
func (s *Service) hostLoads(ctx context.Context) (map[string]hostLoad, error) {
	rows, err := s.db.QueryContext(ctx, sqlHostLoad, StateStarting, StateWarm, StateClaiming, StateRunning)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: load: %w", err)
	}
	defer rows.Close()
	load := map[string]hostLoad{}
	for rows.Next() {
		var id string
		var l hostLoad
		if err := rows.Scan(&id, &l.count, &l.memoryMB); err != nil {
			return nil, fmt.Errorf("sandboxes: load: %w", err)
		}
		load[id] = l
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sandboxes: load: %w", err)
	}
	return load, nil
}

// Create makes a sandbox of template for tenant and returns once it runs:
// it claims a warm one when it can, else starts one cold.
func (s *Service) Create(ctx context.Context, actor audit.Entry, tenant, template string) (Sandbox, error) {
	t, err := s.Template(ctx, iam.ScopeOf(tenant), template)
	if err != nil {
		return Sandbox{}, errs.New(errs.InvalidInput, "template: no template of that name or id in the tenant")
	}
	if t.Warm > 0 {
		x, ok, err := s.claim(ctx, actor, t)
		if err != nil {
			return Sandbox{}, err
		}
		if ok {
			// The pool's refill can wait for the caller's answer.
			afterreply.Do(ctx, func() { s.bus.Publish(TopicWarm) })
			return x, nil
		}
		s.bus.Publish(TopicWarm)
	}
	return s.start(ctx, actor, t, false)
}

// start places and starts a sandbox (warm: unclaimed, no environment).
func (s *Service) start(ctx context.Context, actor audit.Entry, t Template, warm bool) (Sandbox, error) {
	return s.startFrom(ctx, actor, t, warm, nil)
}

// startFrom is start, restoring checkpoint from when it is not nil (t is
// then the checkpoint's own template, as RestoreTemplate made it).
func (s *Service) startFrom(ctx context.Context, actor audit.Entry, t Template, warm bool, from *Checkpoint) (Sandbox, error) {
	if !warm {
		if err := s.recheckEnvSecrets(ctx, t); err != nil {
			return Sandbox{}, err
		}
	}
	node, err := s.place(ctx, t)
	if err != nil {
		return Sandbox{}, err
	}
	now := s.clk.Now()
	x, c, claimed := newSandbox(t, ids.New("sbx"), node, actor.Actor, warm, now)
	if c.Env, err = s.sealEnvFor(t.TenantID, x.ID, c.Env); err != nil {
		return Sandbox{}, err
	}
	details := map[string]any{"template_id": t.ID, "node_id": node, "warm": warm, "image_digest": t.ImageDigest}
	if from != nil {
		x.FromCheckpoint, c.FromCheckpoint, c.FromMemory = from.ID, from.Digest, from.MemoryDigest
		details["from_checkpoint"] = from.ID
	}
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if err := s.admitSandbox(ctx, tx, t, warm); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlInsertSandbox, sandboxArgs(x, claimed, now)...); err != nil {
			return fmt.Errorf("sandboxes: insert: %w", err)
		}
		a := actor
		a.TenantID, a.Action, a.Resource, a.Outcome = t.TenantID, "compute:sandboxes:create", "sandbox/"+x.ID, "allowed"
		a.Details = details
		return audit.Record(ctx, tx, now, a)
	})
	if err != nil {
		return Sandbox{}, err
	}
	_, err = s.runEnv(ctx, actor, t.TenantID, node, kinds.SandboxCreate, c, c.Env, StartTimeout)
	if err != nil {
		s.setState(context.WithoutCancel(ctx), x.ID, StateStarting, StateFailed, reasonOf(err))
		return Sandbox{}, err
	}
	x.State = StateRunning
	if warm {
		x.State = StateWarm
	}
	if !s.setState(ctx, x.ID, StateStarting, x.State, "") {
		return Sandbox{}, errs.New(errs.InvalidState, "the sandbox changed state while starting")
	}
	return x, nil
}

func (s *Service) setState(ctx context.Context, id string, from, to State, reason string) bool {
	res, err := s.db.ExecContext(ctx, sqlSetState, string(to), reason, s.clk.Now().UnixMilli(), id, string(from))
	if err != nil {
		s.log.Error("sandbox state", "sandbox_id", id, "err", err)
		return false
	}
	n, _ := res.RowsAffected()
	return n == 1
}

// errHostTimeout is the cause when a host does not answer in time.
var errHostTimeout = errors.New("host-timeout")

// commandError is a sandbox command that did not succeed.
type commandError struct {
	state, reason string
}

func (e *commandError) Error() string { return "the host answered " + e.state + ": " + e.reason }

func reasonOf(err error) string {
	var ce *commandError
	if errors.As(err, &ce) {
		return ce.reason
	}
	if errors.Is(err, errHostTimeout) {
		return "host-timeout"
	}
	return "error"
}

// run issues a signed sandbox command to node and waits for its result.
func (s *Service) run(ctx context.Context, actor audit.Entry, node, kind string, payload any, wait time.Duration) (json.RawMessage, error) {
	raw, err := json.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: encode payload: %w", err)
	}
	c, err := s.commands.CreateOwned(ctx, kinds.ModuleSandboxes, system(actor), node, kind, raw, wait+time.Minute)
	if err != nil {
		return nil, err
	}
	return s.wait(ctx, c.ID, wait)
}

// runEnv is run for a command carrying env: when env names secret
// references or holds sealed values, the command is created for the
// sandbox's tenant (subject, commands.CreateFor), so the broker releases
// those secrets and the env key to the host for this command alone, and
// only while it is live.
func (s *Service) runEnv(ctx context.Context, actor audit.Entry, subject, node, kind string, payload any, env map[string]string, wait time.Duration) (json.RawMessage, error) {
	if !needsBroker(env) {
		return s.run(ctx, actor, node, kind, payload, wait)
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: encode payload: %w", err)
	}
	c, err := s.commands.CreateFor(ctx, kinds.ModuleSandboxes, system(actor), subject, node, kind, raw, wait+time.Minute)
	if err != nil {
		return nil, err
	}
	return s.wait(ctx, c.ID, wait)
}

// recheckEnvSecrets refuses a new sandbox of t (cold or claimed) when a
// secret its env names is no longer a live secret of t's tenant
// (INVALID_STATE): each new sandbox re-checks what the template was
// decided on.
func (s *Service) recheckEnvSecrets(ctx context.Context, t Template) error {
	err := s.checkEnvSecrets(ctx, t.TenantID, t.Env)
	if errs.CodeOf(err) == errs.InvalidInput {
		return errs.New(errs.InvalidState, "template "+errs.SafeMessage(err))
	}
	return err
}

// wait waits for command id to finish (bus pokes; a poll catches pokes
// from other processes) and returns its result when it succeeded.
func (s *Service) wait(ctx context.Context, id string, within time.Duration) (json.RawMessage, error) {
	poke, stop := s.bus.Subscribe(bus.CommandTopic(id))
	defer stop()
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	poll := time.NewTicker(time.Second)
	defer poll.Stop()
	for {
		c, err := s.commands.Get(ctx, iam.RootScope(), id)
		if err != nil {
			return nil, err
		}
		if commands.Terminal(c.State) {
			if c.State != commands.StateSucceeded {
				return nil, errs.Wrap(errs.InvalidState, "the host refused: "+c.Reason, &commandError{state: string(c.State), reason: c.Reason})
			}
			return c.Result, nil
		}
		select {
		case <-poke:
		case <-poll.C:
		case <-timeout.C:
			return nil, errs.Wrap(errs.InvalidState, "the host did not answer in time", errHostTimeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// ExecResult is what sandboxes.exec answers.
type ExecResult struct {
	spec.ExecResult
	SandboxID string `json:"sandbox_id"`
	CommandID string `json:"command_id"`
	Attested  bool   `json:"attested"`
}

// Exec runs argv in a running sandbox visible in scope and returns its
// streams and exit code. A sandbox that expires within ExecRefuseWithin
// is refused (INVALID_STATE).
func (s *Service) Exec(ctx context.Context, actor audit.Entry, scope iam.Scope, id string, argv []string, timeout time.Duration) (ExecResult, error) {
	x, err := s.GetSettled(ctx, scope, id)
	if err != nil {
		return ExecResult{}, err
	}
	now := s.clk.Now()
	if err := checkExec(x, now); err != nil {
		return ExecResult{}, err
	}
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	e := spec.Exec{SandboxID: id, Argv: argv, TimeoutMS: timeout.Milliseconds()}
	if err := e.Validate(); err != nil {
		return ExecResult{}, errs.New(errs.InvalidInput, err.Error())
	}
	e.EnvRefs = s.execEnvRefs(ctx, x)
	argvJSON, _ := json.Marshal(argv)
	sum := sha256.Sum256(argvJSON)
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		a := actor
		a.TenantID, a.Action, a.Resource, a.Outcome = x.TenantID, "compute:sandboxes:exec", "sandbox/"+id, "allowed"
		a.Details = map[string]any{"argc": len(argv), "argv_sha256": fmt.Sprintf("%x", sum), "timeout_ms": e.TimeoutMS}
		return audit.Record(ctx, tx, now, a)
	})
	if err != nil {
		return ExecResult{}, err
	}
	c, err := s.queueExec(ctx, actor, x, e, timeout)
	if err != nil {
		return ExecResult{}, err
	}
	res, err := s.wait(ctx, c.ID, timeout+30*time.Second)
	if err != nil {
		if reasonOf(err) == "sandbox-failed" {
			// The host found the sandbox's runtime dead and removed it.
			s.setState(context.WithoutCancel(ctx), id, StateRunning, StateFailed, "sandbox-failed")
		}
		return ExecResult{}, err
	}
	var out ExecResult
	if err := json.Unmarshal(res, &out.ExecResult); err != nil {
		return ExecResult{}, fmt.Errorf("sandboxes: exec result: %w", err)
	}
	got, err := s.commands.Get(ctx, iam.RootScope(), c.ID)
	if err == nil {
		out.Attested = got.Attested
	}
	out.SandboxID, out.CommandID = id, c.ID
	return out, nil
}

// Extend moves the expiry of a running sandbox visible in scope to now +
// by, within the template's maximum; the host gets the new deadline
// signed.
func (s *Service) Extend(ctx context.Context, actor audit.Entry, scope iam.Scope, id string, by time.Duration) (Sandbox, error) {
	x, err := s.GetSettled(ctx, scope, id)
	if err != nil {
		return Sandbox{}, err
	}
	now := s.clk.Now()
	deadline, err := extendTo(x, by, now)
	if err != nil {
		return Sandbox{}, err
	}
	if _, err := s.run(ctx, actor, x.NodeID, kinds.SandboxUpdate, spec.Update{SandboxID: id, DeadlineMS: deadline.UnixMilli()}, StartTimeout); err != nil {
		return Sandbox{}, err
	}
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, sqlExtend, deadline.UnixMilli(), now.UnixMilli(), id, StateRunning); err != nil {
			return fmt.Errorf("sandboxes: extend: %w", err)
		}
		a := actor
		a.TenantID, a.Action, a.Resource, a.Outcome = x.TenantID, "compute:sandboxes:extend", "sandbox/"+id, "allowed"
		a.Details = map[string]any{"expires_at_ms": deadline.UnixMilli()}
		return audit.Record(ctx, tx, now, a)
	})
	if err != nil {
		return Sandbox{}, err
	}
	x.ExpiresAt = deadline.UTC()
	return x, nil
}

// Delete marks a sandbox visible in scope deleted at once (its tenant no
// longer sees it running) and has its host stop and remove it, waiting up
// to a bound for the host's answer; an offline host gets the signed
// delete when it reconnects and removes the sandbox at its deadline
// regardless.
func (s *Service) Delete(ctx context.Context, actor audit.Entry, scope iam.Scope, id string) (map[string]any, error) {
	x, err := s.Get(ctx, scope, id)
	if err != nil {
		return nil, err
	}
	if x.State.Final() {
		return map[string]any{"id": id, "state": x.State, "freed": true}, nil
	}
	now := s.clk.Now()
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, sqlMarkDelete, StateDeleted, now.UnixMilli(), id); err != nil {
			return fmt.Errorf("sandboxes: delete: %w", err)
		}
		a := actor
		a.TenantID, a.Action, a.Resource, a.Outcome = x.TenantID, "compute:sandboxes:delete", "sandbox/"+id, "allowed"
		return audit.Record(ctx, tx, now, a)
	})
	if err != nil {
		return nil, err
	}
	freed := s.deleteOnHost(ctx, actor, x.NodeID, id)
	return map[string]any{"id": id, "state": StateDeleted, "freed": freed}, nil
}

// deleteOnHost sends sandbox.delete (valid until the sandbox's longest
// possible deadline, so a host that comes back gets it) and waits briefly.
func (s *Service) deleteOnHost(ctx context.Context, actor audit.Entry, node, id string) bool {
	raw, _ := json.Marshal(spec.Delete{SandboxID: id})
	c, err := s.commands.CreateOwned(ctx, kinds.ModuleSandboxes, system(actor), node, kinds.SandboxDelete, raw, 24*time.Hour)
	if err != nil {
		s.log.Error("sandbox delete command", "sandbox_id", id, "err", err)
		return false
	}
	_, err = s.wait(ctx, c.ID, 30*time.Second)
	return err == nil
}

// SweepExpired marks sandboxes past their expiry expired and sends their
// hosts a signed delete (the hosts remove them at the deadline on their
// own as well). It returns how many it expired.
func (s *Service) SweepExpired(ctx context.Context) (int, error) {
	now := s.clk.Now()
	xs, err := s.sandboxes(ctx, whereExpiredNow, StateStarting, StateWarm, StateClaiming, StateRunning, now.UnixMilli())
	if err != nil {
		return 0, err
	}
	n := 0
	for _, x := range xs {
		if !s.setState(ctx, x.ID, x.State, StateExpired, "expired") {
			continue
		}
		n++
		raw, _ := json.Marshal(spec.Delete{SandboxID: x.ID})
		if _, err := s.commands.CreateOwned(ctx, kinds.ModuleSandboxes, audit.Entry{TenantID: iam.RootTenant, Actor: "sandboxes:expiry"}, x.NodeID, kinds.SandboxDelete, raw, 24*time.Hour); err != nil {
			s.log.Warn("expired sandbox delete command", "sandbox_id", x.ID, "err", err)
		}
	}
	return n, nil
}

// ReconcileWarm starts warm sandboxes until each template with a pool has
// its count of warm ones; it returns how many it started.
func (s *Service) ReconcileWarm(ctx context.Context) (int, error) {
	if err := s.drainOrphans(ctx); err != nil {
		return 0, err
	}
	ts, err := s.templates(ctx, whereWarmPools)
	if err != nil {
		return 0, err
	}
	started := 0
	for _, t := range ts {
		var have int
		if err := s.db.QueryRowContext(ctx, sqlCountPool, t.ID, StateWarm, StateStarting).Scan(&have); err != nil {
			return started, fmt.Errorf("sandboxes: count warm: %w", err)
		}
		// Starting rows of a cold create count too; they are few and brief.
		for ; have < t.Warm; have++ {
			if _, err := s.start(ctx, audit.Entry{TenantID: t.TenantID, Actor: "sandboxes:warm-pool"}, t, true); err != nil {
				s.log.Warn("warm pool start failed", "template_id", t.ID, "err", err)
				break
			}
			started++
		}
	}
	return started, nil
}

// Run sweeps expiries, settles warm claims the hosts answered, purges
// deleted checkpoints nothing uses and
// refills warm pools every interval, collects unreferenced objects every
// CollectEvery, and at once
// when poked, until ctx ends (the workers role runs it).
func (s *Service) Run(ctx context.Context, interval time.Duration) {
	poke, stop := s.bus.Subscribe(TopicWarm)
	defer stop()
	t := time.NewTicker(interval)
	defer t.Stop()
	var collected time.Time
	for {
		if now := s.clk.Now(); now.Sub(collected) >= CollectEvery {
			collected = now
			if _, err := s.CollectObjects(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("collect objects", "err", err)
			}
		}
		if _, err := s.SweepExpired(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("sweep expired sandboxes", "err", err)
		}
		if _, err := s.ConfirmClaims(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("confirm warm claims", "err", err)
		}
		if _, err := s.PurgeCheckpoints(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("purge checkpoints", "err", err)
		}
		if !s.holdRefill.Load() {
			if _, err := s.ReconcileWarm(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("reconcile warm pools", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-poke:
		}
	}
}

// WarmCount returns how many warm sandboxes template id holds (tests).
func (s *Service) WarmCount(ctx context.Context, templateID string) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, sqlCountWarm, templateID, StateWarm).Scan(&n)
	return n, err
}

// ExecTarget returns the node an interactive exec in sandbox id goes to,
// for a caller who sees it through scope: the sandbox must be running and
// not expire within ExecRefuseWithin (INVALID_STATE), as for Exec; one it
// cannot see is NOT_FOUND. The tunnels module issues the exec's ticket.
func (s *Service) ExecTarget(ctx context.Context, scope iam.Scope, id string) (string, error) {
	x, err := s.GetSettled(ctx, scope, id)
	if err != nil {
		return "", err
	}
	if err := checkExec(x, s.clk.Now()); err != nil {
		return "", err
	}
	return x.NodeID, nil
}
