// Package quota bounds what one tenant may hold, so that one tenant cannot
// take the capacity or the database the others need. It owns the
// tenant_quotas table (a root operator's per-tenant overrides of the
// configured defaults) and the decision; each module counts its own rows.
//
// A quota is held by a top-level tenant (a direct child of the root
// tenant) and the whole subtree under it: what any tenant below holds is
// charged to its top-level tenant, and the limits are the top-level
// tenant's alone (overrides are set only on top-level tenants), so a
// tenant admin cannot multiply its quota by making child tenants.
//
// A module calls Admit inside the transaction that inserts the rows the
// quota bounds. Admit serialises the top-level tenant's admissions of that
// quota (a PostgreSQL advisory transaction lock; SQLite transactions are
// already serial: they begin IMMEDIATE), counts what the subtree holds with
// the module's own count, and refuses with RESOURCE_EXHAUSTED when the new
// rows would take it past its limit. So parallel calls never overshoot.
//
// The root tenant, the deployment's operator, is not limited: its fleet and
// sandbox-host commands run as root.
package quota

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Kind names one quota.
type Kind string

// The quotas.
const (
	// JoinTokens bounds a tenant's outstanding join tokens: unused and
	// unexpired.
	JoinTokens Kind = "join_tokens"
	// Sandboxes bounds a tenant's live sandboxes (starting, being claimed
	// or running; warm ones count under WarmMemoryMB).
	Sandboxes Kind = "sandboxes"
	// WarmMemoryMB bounds the memory of a tenant's warm pools, in MiB: the
	// sum over its templates of warm × memory_mb, and the memory its
	// unclaimed warm sandboxes hold.
	WarmMemoryMB Kind = "warm_memory_mb"
	// CommandsInFlight bounds a tenant's commands that are queued, sent or
	// running.
	CommandsInFlight Kind = "commands_in_flight"
)

// Kinds lists every quota in a stable order.
var Kinds = []Kind{JoinTokens, Sandboxes, WarmMemoryMB, CommandsInFlight}

// what describes a quota's unit in messages.
var what = map[Kind]string{
	JoinTokens:       "outstanding join tokens",
	Sandboxes:        "live sandboxes",
	WarmMemoryMB:     "MiB of warm-pool memory",
	CommandsInFlight: "commands in flight",
}

// MaxLimit bounds any limit a root operator may set.
const MaxLimit = 1 << 40

// Limits are one tenant's limits, one per Kind.
type Limits struct {
	JoinTokens       int64 `json:"join_tokens"`
	Sandboxes        int64 `json:"sandboxes"`
	WarmMemoryMB     int64 `json:"warm_memory_mb"`
	CommandsInFlight int64 `json:"commands_in_flight"`
}

// Defaults are the documented default limits (config's [quotas] section
// starts from them).
func Defaults() Limits {
	return Limits{JoinTokens: 10000, Sandboxes: 100, WarmMemoryMB: 8192, CommandsInFlight: 20000}
}

// Of returns the limit of kind k.
func (l Limits) Of(k Kind) int64 {
	switch k {
	case JoinTokens:
		return l.JoinTokens
	case Sandboxes:
		return l.Sandboxes
	case WarmMemoryMB:
		return l.WarmMemoryMB
	case CommandsInFlight:
		return l.CommandsInFlight
	}
	return 0
}

// Validate reports every limit outside 0..MaxLimit, by its field name.
func (l Limits) Validate() []string {
	var probs []string
	for _, k := range Kinds {
		if v := l.Of(k); v < 0 || v > MaxLimit {
			probs = append(probs, fmt.Sprintf("%s: 0 to %d", k, int64(MaxLimit)))
		}
	}
	return probs
}

// Decide admits want more units of quota k to a tenant that holds used,
// under limit: nil, or RESOURCE_EXHAUSTED naming the quota and its limit.
// A want of 0 is always admitted.
func Decide(k Kind, limit, used, want int64) error {
	if want <= 0 || used+want <= limit && used+want >= used {
		return nil
	}
	return errs.New(errs.ResourceExhausted, Message(k, limit, used, want))
}

// Message is the refusal's text (tests compare it exactly).
func Message(k Kind, limit, used, want int64) string {
	return fmt.Sprintf("quota %s exceeded: the tenant may hold at most %d %s (it holds %d; this call needs %d more)", k, limit, what[k], used, want)
}

// Counter counts, inside tx, what the top-level tenant top and every
// tenant under it hold of one quota (select the rows with InSubtree, top
// as its $1).
type Counter func(ctx context.Context, tx *sql.Tx, top string) (int64, error)

// MaxDepth bounds the tenant tree a quota walks: a tenant more than
// MaxDepth levels below the root tenant is refused every admission.
const MaxDepth = 64

// InSubtree is an SQL condition on a row's tenant_id: the tenant $1 or
// any tenant under it (down to MaxDepth levels).
// The tenant tree is iam's: the condition is iam.SubtreeCondition.
const InSubtree = iam.SubtreeCondition

// errTooDeep refuses an admission for a tenant whose top-level tenant is
// not found within MaxDepth levels.
var errTooDeep = errs.New(errs.InvalidState, "the tenant is nested too deep for its quotas to be decided")

// TopLevel returns the top-level tenant tenant is charged to: the root
// tenant's direct child it is, or is under; the root tenant for itself. A
// tenant not in the tenant table is its own (only tests admit such).
//
// A tenant's parent never changes (tenants are created under a parent and
// never moved, and ids are never reused), so the answer for a tenant found
// in the table is kept in memory (up to maxTopLevels tenants, then
// forgotten all at once): an admission's chain read was a recursive query
// for every quota it checked.
func (s *Service) TopLevel(ctx context.Context, tx *sql.Tx, tenant string) (string, error) {
	if Exempt(tenant) {
		return tenant, nil
	}
	s.topMu.Lock()
	top, ok := s.tops[tenant]
	s.topMu.Unlock()
	if ok {
		return top, nil
	}
	chain, err := iam.ChainIn(ctx, tx, tenant, MaxDepth)
	if err != nil {
		return "", fmt.Errorf("quota: read tenant chain: %w", err)
	}
	top, err = topLevelOf(tenant, chain)
	if err != nil || len(chain) == 0 {
		return top, err
	}
	s.topMu.Lock()
	if len(s.tops) >= maxTopLevels {
		clear(s.tops)
	}
	s.tops[tenant] = top
	s.topMu.Unlock()
	return top, nil
}

// maxTopLevels bounds the tenants whose top-level tenant TopLevel keeps.
const maxTopLevels = 1 << 16

// topLevelOf is TopLevel's decision on tenant's chain (nearest first, at
// most MaxDepth+1 tenants): the tenant of the chain whose parent is the
// root tenant; tenant itself when the chain is empty (a tenant not in the
// tenant table); errTooDeep when no tenant of the chain is a root's child.
func topLevelOf(tenant string, chain []iam.Tenant) (string, error) {
	if iam.IsRoot(tenant) {
		return tenant, nil
	}
	for _, t := range chain {
		if iam.IsRoot(t.ParentID) {
			return t.ID, nil
		}
	}
	if len(chain) == 0 {
		return tenant, nil
	}
	return "", errTooDeep
}

// Service reads tenants' limits and admits new rows against them.
type Service struct {
	db       *store.DB
	clk      clock.Clock
	defaults Limits

	mu      sync.Mutex
	refused map[usageKey]recount // exact recounts behind recent refusals

	topMu sync.Mutex
	tops  map[string]string // tenant -> its top-level tenant (TopLevel)
}

// New returns the quota service with the configured defaults.
func New(db *store.DB, clk clock.Clock, defaults Limits) *Service {
	if clk == nil {
		clk = clock.Real{}
	}
	return &Service{db: db, clk: clk, defaults: defaults, refused: map[usageKey]recount{}, tops: map[string]string{}}
}

// Exempt reports whether tenant is outside quotas (the root tenant).
func Exempt(tenant string) bool { return iam.IsRoot(tenant) }

// Admit decides, inside tx, whether tenant may take want more of quota k:
// it takes the lock of tenant's top-level tenant for k for the rest of tx,
// reads the top-level tenant's limit, counts its subtree with count and
// decides. Call it in the transaction that inserts the rows, before the
// insert. Use it for quotas over few rows (sandboxes, templates);
// AdmitTracked for large ones.
func (s *Service) Admit(ctx context.Context, tx *sql.Tx, tenant string, k Kind, want int64, count Counter) error {
	if Exempt(tenant) || want <= 0 {
		return nil
	}
	top, err := s.TopLevel(ctx, tx, tenant)
	if err != nil {
		return err
	}
	if err := lock(ctx, tx, s.db.Dialect, top, k); err != nil {
		return err
	}
	lim, err := s.limits(ctx, tx, top)
	if err != nil {
		return err
	}
	used, err := count(ctx, tx, top)
	if err != nil {
		return fmt.Errorf("quota: count %s: %w", k, err)
	}
	return Decide(k, lim.Of(k), used, want)
}

// Recount bounds for AdmitTracked: a usage older than RecountEvery is
// recounted before it is used; a refusal recounts at most once per
// RecountRefusedEvery per tenant and quota in this process.
const (
	RecountEvery        = time.Minute
	RecountRefusedEvery = time.Second
)

// AdmitTracked is Admit for quotas over many rows (join tokens, commands
// in flight): it decides whether want more fit on the tracked usage
// (quota_usage) of tenant's top-level tenant and raises it in tx by take (the rows tx inserts; a
// bulk call's chunk asks for all it still needs and takes its chunk),
// instead of counting the rows each time.
// Freed rows leave the usage high, never low, so it refuses only after an
// exact recount (count), which a refusal does at most once per
// RecountRefusedEvery; a usage older than RecountEvery is recounted first.
// Every insert of rows the quota bounds must go through it.
func (s *Service) AdmitTracked(ctx context.Context, tx *sql.Tx, tenant string, k Kind, want, take int64, count Counter) error {
	if Exempt(tenant) || want <= 0 {
		return nil
	}
	tenant, err := s.TopLevel(ctx, tx, tenant) // from here on, the top-level tenant
	if err != nil {
		return err
	}
	if err := lock(ctx, tx, s.db.Dialect, tenant, k); err != nil {
		return err
	}
	lim, err := s.limits(ctx, tx, tenant)
	if err != nil {
		return err
	}
	now := s.clk.Now()
	var used, counted int64
	err = tx.QueryRowContext(ctx, qUsage, tenant, string(k)).Scan(&used, &counted)
	fresh := err == nil && usageFresh(counted, now)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("quota: read usage: %w", err)
	}
	recount := func() error {
		n, err := count(ctx, tx, tenant)
		if err != nil {
			return fmt.Errorf("quota: count %s: %w", k, err)
		}
		used, counted = n, now.UnixMilli()
		return nil
	}
	if !fresh {
		if err := recount(); err != nil {
			return err
		}
	}
	if Decide(k, lim.Of(k), used, want) != nil && fresh {
		if n, ok := s.recentRefusal(tenant, k, now); ok {
			used = max(used, n)
		} else if err := recount(); err != nil {
			return err
		}
	}
	if err := Decide(k, lim.Of(k), used, want); err != nil {
		s.noteRefusal(tenant, k, now, used)
		return err
	}
	if _, err := tx.ExecContext(ctx, qUpsertUsage, tenant, string(k), used+take, counted); err != nil {
		return fmt.Errorf("quota: record usage: %w", err)
	}
	return nil
}

// usageFresh reports whether a tracked usage counted at counted (unix ms)
// may be decided on at now without a recount: it is younger than
// RecountEvery (a clock that stepped back counts as fresh, as the age is
// negative).
func usageFresh(counted int64, now time.Time) bool {
	return now.Sub(time.UnixMilli(counted)) < RecountEvery
}

type usageKey struct {
	tenant string
	kind   Kind
}

type recount struct {
	used int64
	at   time.Time
}

// recentRefusal returns the usage an exact recount found for a refusal
// less than RecountRefusedEvery ago in this process.
func (s *Service) recentRefusal(tenant string, k Kind, now time.Time) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.refused[usageKey{tenant, k}]
	if !ok || now.Sub(r.at) >= RecountRefusedEvery || now.Before(r.at) {
		return 0, false
	}
	return r.used, true
}

func (s *Service) noteRefusal(tenant string, k Kind, now time.Time, used int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.refused) > 10000 {
		clear(s.refused)
	}
	key := usageKey{tenant, k}
	if r, ok := s.refused[key]; ok && now.Sub(r.at) < RecountRefusedEvery {
		return // keep the time of the last exact recount
	}
	s.refused[key] = recount{used: used, at: now}
}

// lock serialises tenant's admissions of quota k until tx ends. SQLite
// needs none: its write transactions begin IMMEDIATE, one at a time.
func lock(ctx context.Context, tx *sql.Tx, d store.Dialect, tenant string, k Kind) error {
	if d != store.Postgres {
		return nil
	}
	if _, err := tx.ExecContext(ctx, qLock, LockKey(tenant, k)); err != nil {
		return fmt.Errorf("quota: lock: %w", err)
	}
	return nil
}

// LockKey is the advisory lock key of (tenant, k): a 64-bit FNV-1a of both.
// Two pairs that collide only wait for each other.
func LockKey(tenant string, k Kind) int64 {
	h := fnv.New64a()
	h.Write([]byte("bc-quota\x00" + string(k) + "\x00" + tenant))
	return int64(h.Sum64())
}

// Limits returns tenant's effective limits: its top-level tenant's
// overrides over the defaults (a tenant under it shares them).
func (s *Service) Limits(ctx context.Context, tenant string) (Limits, error) {
	var out Limits
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		top, err := s.TopLevel(ctx, tx, tenant)
		if err != nil {
			return err
		}
		out, err = s.limits(ctx, tx, top)
		return err
	})
	return out, err
}

func (s *Service) limits(ctx context.Context, tx *sql.Tx, tenant string) (Limits, error) {
	l, err := scanLimits(tx.QueryRowContext(ctx, qLimits, tenant), s.defaults)
	if errors.Is(err, sql.ErrNoRows) {
		return s.defaults, nil
	}
	if err != nil {
		return Limits{}, fmt.Errorf("quota: read limits: %w", err)
	}
	return l, nil
}

// Overrides are the limits a root operator sets for one tenant; a nil
// field keeps (or returns to, with Reset) the default.
type Overrides struct {
	JoinTokens       *int64 `json:"join_tokens,omitempty"`
	Sandboxes        *int64 `json:"sandboxes,omitempty"`
	WarmMemoryMB     *int64 `json:"warm_memory_mb,omitempty"`
	CommandsInFlight *int64 `json:"commands_in_flight,omitempty"`
}

// Set stores tenant's overrides (each given field replaces the stored one;
// reset returns every field not given to the default), with its audit row
// in the same transaction, and returns the effective limits. The caller has
// checked that tenant exists and that the actor may set quotas. Only a
// top-level tenant has overrides: for a tenant under one it is
// INVALID_STATE (it shares its top-level tenant's quotas).
func (s *Service) Set(ctx context.Context, actor audit.Entry, tenant string, o Overrides, reset bool) (Limits, error) {
	vals := []*int64{o.JoinTokens, o.Sandboxes, o.WarmMemoryMB, o.CommandsInFlight}
	for i, v := range vals {
		if v != nil && (*v < 0 || *v > MaxLimit) {
			return Limits{}, errs.New(errs.InvalidInput, fmt.Sprintf("%s: 0 to %d", Kinds[i], int64(MaxLimit)))
		}
	}
	now := s.clk.Now()
	var out Limits
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		if top, err := s.TopLevel(ctx, tx, tenant); err != nil {
			return err
		} else if top != tenant {
			return errs.New(errs.InvalidState, "quotas are set on a top-level tenant; a tenant under it shares its quotas")
		}
		args := []any{tenant, now.UnixMilli()}
		for _, v := range vals {
			if v != nil {
				args = append(args, *v)
			} else {
				args = append(args, nil)
			}
		}
		if _, err := tx.ExecContext(ctx, upsertLimits(reset), args...); err != nil {
			return fmt.Errorf("quota: set: %w", err)
		}
		var err error
		if out, err = s.limits(ctx, tx, tenant); err != nil {
			return err
		}
		actor.TenantID, actor.Action, actor.Resource, actor.Outcome = tenant, "compute:tenants:set-quotas", "tenant/"+tenant, "allowed"
		actor.Details = map[string]any{"limits": out, "reset": reset}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return Limits{}, err
	}
	return out, nil
}
