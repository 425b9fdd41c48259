package sandboxes

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sandboxes/checkpoint"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Checkpoint is a sandbox's writable layer (and, on runsc, its memory)
// kept as content-addressed archives in the object store. It belongs to
// the sandbox's owner, whoever took it; it is restored only under what it
// was taken under: its template, and the image, runtime, network mode and
// user the sandbox ran with.
type Checkpoint struct {
	ID           string    `json:"id"`
	TenantID     string    `json:"tenant_id"`
	Owner        string    `json:"owner"`
	SandboxID    string    `json:"sandbox_id"`
	TemplateID   string    `json:"template_id"`
	ImageDigest  string    `json:"image_digest"`
	Runtime      string    `json:"runtime"`
	Network      string    `json:"network"`
	Root         bool      `json:"root"`
	Digest       string    `json:"digest"`
	Size         int64     `json:"size"`
	MemoryDigest string    `json:"memory_digest,omitempty"`
	MemorySize   int64     `json:"memory_size,omitempty"`
	TakenBy      string    `json:"taken_by"`
	CreatedAt    time.Time `json:"created_at"`
}

// ErrCheckpointNotFound answers for a checkpoint that does not exist,
// was deleted, or belongs to another identity: the same bytes in each
// case, so a caller learns nothing of checkpoints that are not its own.
var ErrCheckpointNotFound = errs.New(errs.NotFound, "checkpoint not found")

// CheckpointTimeout bounds how long a checkpoint waits for its host.
const CheckpointTimeout = 5 * time.Minute

// The module's checkpoint SQL (its own table, sandbox_checkpoints).
const (
	sqlCheckpointCols = `id, tenant_id, owner_id, sandbox_id, template_id, image_digest, runtime, network, run_as_root, digest, size_bytes,
	memory_digest, memory_size, taken_by, created_at`
	sqlInsertCheckpoint = `INSERT INTO sandbox_checkpoints (` + sqlCheckpointCols + `)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`
	sqlSelectCheckpoints = `SELECT ` + sqlCheckpointCols + ` FROM sandbox_checkpoints`
	sqlDeleteCheckpoint  = `UPDATE sandbox_checkpoints SET deleted_at = $1 WHERE id = $2 AND deleted_at IS NULL`

	// Conditions after sqlSelectCheckpoints.
	whereOwnCheckpoint  = `WHERE id = $1 AND tenant_id = $2 AND owner_id = $3 AND deleted_at IS NULL`
	whereOwnCheckpoints = `WHERE tenant_id = $1 AND owner_id = $2 AND deleted_at IS NULL ORDER BY created_at DESC, id`
)

// Checkpoint captures running sandbox id (visible in scope) through its
// host and records the checkpoint, owned by the sandbox's owner. memory
// asks the host for the processes' memory too, which needs runsc.
func (s *Service) Checkpoint(ctx context.Context, actor audit.Entry, scope iam.Scope, id string, memory bool) (Checkpoint, error) {
	x, err := s.GetSettled(ctx, scope, id)
	if err != nil {
		return Checkpoint{}, err
	}
	switch {
	case x.State != StateRunning:
		return Checkpoint{}, errs.New(errs.InvalidState, "the sandbox is not running")
	case x.run.image == "":
		return Checkpoint{}, errs.New(errs.InvalidState, "the sandbox started before checkpoints existed; start a new one")
	case memory && x.Runtime != spec.RuntimeRunsc:
		return Checkpoint{}, errs.New(errs.InvalidInput, "memory: memory checkpoints need runsc; this sandbox runs on "+x.Runtime)
	}
	raw, err := s.run(ctx, actor, x.NodeID, kinds.SandboxCheckpoint, spec.Checkpoint{SandboxID: id, Memory: memory}, CheckpointTimeout)
	if err != nil {
		return Checkpoint{}, err
	}
	var res spec.CheckpointResult
	if err := json.Unmarshal(raw, &res); err != nil || res.Validate() != nil || (memory != (res.MemoryDigest != "")) {
		s.log.Warn("sandbox checkpoint answer refused", "sandbox_id", id, "node_id", x.NodeID)
		return Checkpoint{}, errs.New(errs.Internal, "the host's checkpoint answer was malformed")
	}
	now := s.clk.Now()
	ck := Checkpoint{ID: ids.New("ckp"), TenantID: x.TenantID, Owner: x.CreatedBy, SandboxID: x.ID, TemplateID: x.TemplateID,
		ImageDigest: x.run.image, Runtime: x.Runtime, Network: x.run.network, Root: x.run.root, Digest: res.Digest, Size: res.Size,
		MemoryDigest: res.MemoryDigest, MemorySize: res.MemorySize, TakenBy: actor.Actor, CreatedAt: now.UTC()}
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, sqlInsertCheckpoint, checkpointArgs(ck)...); err != nil {
			return fmt.Errorf("sandboxes: insert checkpoint: %w", err)
		}
		a := actor
		a.TenantID, a.Action, a.Resource, a.Outcome = x.TenantID, "compute:sandboxes:checkpoint", "sandbox/"+id, "allowed"
		a.Details = map[string]any{"checkpoint_id": ck.ID, "digest": ck.Digest, "size": ck.Size, "memory": memory, "owner": ck.Owner}
		return audit.Record(ctx, tx, now, a)
	})
	if err != nil {
		return Checkpoint{}, err
	}
	return ck, nil
}

// checkpointArgs are sqlInsertCheckpoint's arguments for ck.
func checkpointArgs(ck Checkpoint) []any {
	return []any{ck.ID, ck.TenantID, ck.Owner, ck.SandboxID, ck.TemplateID, ck.ImageDigest, ck.Runtime, ck.Network, boolInt(ck.Root),
		ck.Digest, ck.Size, ck.MemoryDigest, ck.MemorySize, ck.TakenBy, ck.CreatedAt.UnixMilli()}
}

// scanCheckpoint reads one row of sqlSelectCheckpoints.
func scanCheckpoint(r scanner) (Checkpoint, error) {
	var ck Checkpoint
	var root int
	var at int64
	if err := r.Scan(&ck.ID, &ck.TenantID, &ck.Owner, &ck.SandboxID, &ck.TemplateID, &ck.ImageDigest, &ck.Runtime, &ck.Network, &root,
		&ck.Digest, &ck.Size, &ck.MemoryDigest, &ck.MemorySize, &ck.TakenBy, &at); err != nil {
		return Checkpoint{}, fmt.Errorf("sandboxes: scan checkpoint: %w", err)
	}
	ck.Root, ck.CreatedAt = root == 1, time.UnixMilli(at).UTC()
	return ck, nil
}

func (s *Service) checkpoints(ctx context.Context, where string, args ...any) ([]Checkpoint, error) {
	rows, err := s.db.QueryContext(ctx, sqlSelectCheckpoints+" "+where, args...)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: list checkpoints: %w", err)
	}
	defer rows.Close()
	out := []Checkpoint{}
	for rows.Next() {
		ck, err := scanCheckpoint(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, ck)
	}
	return out, rows.Err()
}

// ownCheckpoint returns checkpoint id of tenant if owner owns it and it
// is not deleted; ErrCheckpointNotFound otherwise.
func (s *Service) ownCheckpoint(ctx context.Context, tenant, owner, id string) (Checkpoint, error) {
	cks, err := s.checkpoints(ctx, whereOwnCheckpoint, id, tenant, owner)
	if err != nil {
		return Checkpoint{}, err
	}
	if len(cks) != 1 {
		return Checkpoint{}, ErrCheckpointNotFound
	}
	return cks[0], nil
}

// ListCheckpoints returns the caller's own checkpoints in tenant, newest
// first: another identity's are never listed.
func (s *Service) ListCheckpoints(ctx context.Context, actor audit.Entry, tenant string) ([]Checkpoint, error) {
	return s.checkpoints(ctx, whereOwnCheckpoints, tenant, actor.Actor)
}

// DeleteCheckpoint deletes the caller's own checkpoint id of tenant (any
// other answers ErrCheckpointNotFound) and purges what nothing uses any
// more.
func (s *Service) DeleteCheckpoint(ctx context.Context, actor audit.Entry, tenant, id string) (map[string]any, error) {
	ck, err := s.ownCheckpoint(ctx, tenant, actor.Actor, id)
	if err != nil {
		return nil, err
	}
	now := s.clk.Now()
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, sqlDeleteCheckpoint, now.UnixMilli(), ck.ID); err != nil {
			return fmt.Errorf("sandboxes: delete checkpoint: %w", err)
		}
		a := actor
		a.TenantID, a.Action, a.Resource, a.Outcome = ck.TenantID, "compute:checkpoints:delete", "checkpoint/"+ck.ID, "allowed"
		a.Details = map[string]any{"digest": ck.Digest}
		return audit.Record(ctx, tx, now, a)
	})
	if err != nil {
		return nil, err
	}
	if _, err := s.PurgeCheckpoints(ctx); err != nil {
		s.log.Warn("purge checkpoints", "err", err)
	}
	return map[string]any{"id": ck.ID, "deleted": true}, nil
}

// CreateFrom restores the caller's own checkpoint ckID as a new sandbox of
// tenant. It runs under the checkpoint's own template (template, when
// given, must name it) with the image, runtime, network mode and user the
// checkpoint was taken under; limits, lifetime and environment are the
// template's now. It is never a warm claim.
func (s *Service) CreateFrom(ctx context.Context, actor audit.Entry, tenant, template, ckID string) (Sandbox, error) {
	t, ck, err := s.RestoreTemplate(ctx, tenant, actor.Actor, template, ckID)
	if err != nil {
		return Sandbox{}, err
	}
	return s.startFrom(ctx, actor, t, false, &ck)
}

// RestoreTemplate is the template a restore of owner's checkpoint ckID in
// tenant runs under, exactly as CreateFrom would start it (the
// checkpoint's own template with the checkpoint's image, runtime, network
// mode and user), and the checkpoint: what an agent's person is shown
// before the restore is allowed (internal/api's held-back requests).
func (s *Service) RestoreTemplate(ctx context.Context, tenant, owner, template, ckID string) (Template, Checkpoint, error) {
	ck, err := s.ownCheckpoint(ctx, tenant, owner, ckID)
	if err != nil {
		return Template{}, Checkpoint{}, err
	}
	t, err := s.Template(ctx, iam.ScopeOf(tenant), ck.TemplateID)
	if err != nil {
		return Template{}, Checkpoint{}, errs.New(errs.InvalidState, "the checkpoint's template was deleted; it cannot be restored")
	}
	if template != "" && template != t.ID && template != t.Name {
		return Template{}, Checkpoint{}, errs.New(errs.InvalidInput, "template: a restore runs under its checkpoint's own template; leave template out")
	}
	t.ImageDigest, t.Runtime, t.Network, t.Root = ck.ImageDigest, ck.Runtime, ck.Network, ck.Root
	return t, ck, nil
}

// The purge's SQL: deleted checkpoints not yet purged, whether a live
// sandbox restores from one, and whether any other unpurged checkpoint
// holds the same object.
const (
	sqlPurgeable = `SELECT id, digest, memory_digest FROM sandbox_checkpoints WHERE deleted_at IS NOT NULL AND purged_at IS NULL ORDER BY id`
	sqlRestoring = `SELECT COUNT(*) FROM sandboxes WHERE from_checkpoint = $1 AND state IN ($2, $3, $4, $5)`
	sqlMarkPurge = `UPDATE sandbox_checkpoints SET purged_at = $1 WHERE id = $2 AND purged_at IS NULL`
	sqlDigestUse = `SELECT COUNT(*) FROM sandbox_checkpoints WHERE purged_at IS NULL AND (digest = $1 OR memory_digest = $1)`
)

// Owners tells whether a checkpoint's owner still exists (the iam
// module's Identity answers NOT_FOUND for a deleted identity).
type Owners interface {
	Identity(ctx context.Context, id string) (iam.Identity, error)
}

// SetOwners makes PurgeCheckpoints drop the checkpoints of owners that no
// longer exist; without it they are kept.
func (s *Service) SetOwners(o Owners) { s.owners = o }

// The orphan drop's SQL.
const (
	sqlCheckpointOwners = `SELECT DISTINCT owner_id FROM sandbox_checkpoints WHERE deleted_at IS NULL ORDER BY owner_id`
	sqlDropOwners       = `UPDATE sandbox_checkpoints SET deleted_at = $1 WHERE owner_id = $2 AND deleted_at IS NULL`
)

// dropOrphans deletes every checkpoint whose owner identity was deleted:
// a checkpoint is its owner's alone, and nobody inherits it.
func (s *Service) dropOrphans(ctx context.Context) error {
	if s.owners == nil {
		return nil
	}
	owners, err := s.column(ctx, sqlCheckpointOwners)
	if err != nil {
		return err
	}
	for _, o := range owners {
		if _, err := s.owners.Identity(ctx, o); errs.CodeOf(err) != errs.NotFound {
			continue // it exists, or it cannot be told: kept
		}
		now := s.clk.Now()
		err := s.db.Tx(ctx, func(tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, sqlDropOwners, now.UnixMilli(), o)
			if err != nil {
				return fmt.Errorf("sandboxes: drop checkpoints: %w", err)
			}
			n, _ := res.RowsAffected()
			return audit.Record(ctx, tx, now, audit.Entry{TenantID: iam.RootTenant, Actor: "sandboxes:checkpoints", Action: "compute:checkpoints:delete",
				Resource: "identity/" + o, Outcome: "allowed", Details: map[string]any{"reason": "owner-deleted", "checkpoints": n}})
		})
		if err != nil {
			return err
		}
		s.log.Info("checkpoints of a deleted owner dropped", "owner", o)
	}
	return nil
}

// PurgeCheckpoints drops the checkpoints of deleted owners (SetOwners),
// then removes the objects of deleted checkpoints that no live sandbox
// restores from and no other checkpoint holds, and returns how many
// checkpoints it purged. A purge never touches what a live sandbox or a
// kept checkpoint needs; an object it could not remove is kept.
func (s *Service) PurgeCheckpoints(ctx context.Context) (int, error) {
	s.purging.Lock()
	defer s.purging.Unlock()
	if err := s.dropOrphans(ctx); err != nil {
		return 0, err
	}
	type cand struct{ id, digest, memory string }
	var cs []cand
	rows, err := s.db.QueryContext(ctx, sqlPurgeable)
	if err != nil {
		return 0, fmt.Errorf("sandboxes: purgeable checkpoints: %w", err)
	}
	for rows.Next() {
		var c cand
		if err := rows.Scan(&c.id, &c.digest, &c.memory); err != nil {
			rows.Close()
			return 0, fmt.Errorf("sandboxes: purgeable checkpoints: %w", err)
		}
		cs = append(cs, c)
	}
	rows.Close()
	n := 0
	for _, c := range cs {
		var live int
		if err := s.db.QueryRowContext(ctx, sqlRestoring, c.id, StateStarting, StateWarm, StateClaiming, StateRunning).Scan(&live); err != nil {
			return n, fmt.Errorf("sandboxes: checkpoint use: %w", err)
		}
		if live > 0 {
			continue
		}
		res, err := s.db.ExecContext(ctx, sqlMarkPurge, s.clk.Now().UnixMilli(), c.id)
		if err != nil {
			return n, fmt.Errorf("sandboxes: mark purged: %w", err)
		}
		if k, err := res.RowsAffected(); err == nil && k == 0 {
			continue // another process's purge marked it first and removes its objects
		}
		n++
		for _, d := range []string{c.digest, c.memory} {
			s.purgeObject(ctx, d)
		}
	}
	return n, nil
}

// purgeObject removes checkpoint object digest when no unpurged
// checkpoint holds it.
func (s *Service) purgeObject(ctx context.Context, digest string) {
	if digest == "" || s.images == nil {
		return
	}
	var users int
	if err := s.db.QueryRowContext(ctx, sqlDigestUse, digest).Scan(&users); err != nil || users > 0 {
		return
	}
	if err := checkpoint.StoreOn(s.images).Delete(ctx, digest); err != nil && !errors.Is(err, checkpoint.ErrNotFound) {
		s.log.Warn("checkpoint object not purged", "digest", digest, "err", err)
		return
	}
	s.log.Info("checkpoint object purged", "digest", digest)
}
