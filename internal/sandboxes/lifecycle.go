package sandboxes

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// The statements of templates.update and images.delete.
const (
	sqlDeleteTemplateRow = `DELETE FROM sandbox_templates WHERE id = $1 AND tenant_id = $2`
	sqlTemplateEnvCol    = `SELECT env FROM sandbox_templates WHERE id = $1 AND tenant_id = $2`
	sqlImageOf           = `SELECT digest FROM sandbox_images WHERE tenant_id = $1 AND name = $2`
	sqlTemplatesUsing    = `SELECT COUNT(*) FROM sandbox_templates WHERE tenant_id = $1 AND image_name = $2`
	sqlDeleteImage       = `DELETE FROM sandbox_images WHERE tenant_id = $1 AND name = $2`
)

// UpdateTemplate replaces the recipe of a template of tenant (found by id
// or name) with in, keeping its id and name (in.Name must be empty or the
// same): the new recipe is checked and admitted against the warm-pool
// quota as a new template would be (the old recipe no longer counted), and
// the template's warm pool is drained (warm sandboxes were made from the
// old recipe) and refilled from the new one. Sandboxes already claimed
// keep running to their expiry. One audit row, in one transaction.
//
// decidedOld are the secret references the template named when the
// caller was decided on them (EnvRefs of the template the API read): if
// the template names others by the time the update writes, it is refused
// (CONFLICT, ReasonSecretsChanged). The new recipe's references must be
// live secrets the tenant put (checkEnvSecrets).
func (s *Service) UpdateTemplate(ctx context.Context, actor audit.Entry, tenant, idOrName string, in TemplateIn, decidedOld []string) (Template, error) {
	old, err := s.Template(ctx, iam.ScopeOf(tenant), idOrName)
	if err != nil {
		return Template{}, err
	}
	if in.Name != "" && in.Name != old.Name {
		return Template{}, errs.New(errs.InvalidInput, "name: a template keeps its name (make a new template to rename)")
	}
	in.Name = old.Name
	t, envJSON, labelsJSON, err := newTemplate(in, old.ID, old.TenantID, actor.Actor, s.clk.Now())
	if err != nil {
		return Template{}, err
	}
	if err := s.checkEnvSecrets(ctx, old.TenantID, t.Env); err != nil {
		return Template{}, err
	}
	envCol, err := s.sealEnv(old.TenantID, old.ID, envJSON)
	clear(envJSON)
	if err != nil {
		return Template{}, err
	}
	err = s.db.QueryRowContext(ctx, sqlImageDigest, old.TenantID, t.Image).Scan(&t.ImageDigest)
	if errors.Is(err, sql.ErrNoRows) {
		return Template{}, errs.New(errs.InvalidInput, "image: no image of that name in the tenant")
	}
	if err != nil {
		return Template{}, fmt.Errorf("sandboxes: read image: %w", err)
	}
	now := s.clk.Now()
	var drained []Sandbox
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if err := s.sameSecrets(ctx, tx, old, decidedOld); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, sqlDeleteTemplateRow, old.ID, old.TenantID)
		if err != nil {
			return fmt.Errorf("sandboxes: update template: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.NotFound, "template not found")
		}
		if err := s.admitWarmPools(ctx, tx, old.TenantID, int64(t.Warm)*t.Limits.MemoryMB); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlInsertTemplate, templateArgs(t, envCol, labelsJSON, now)...); err != nil {
			return fmt.Errorf("sandboxes: update template: %w", err)
		}
		if drained, err = drainWarm(ctx, tx, poolOfTemplate, old.ID); err != nil {
			return err
		}
		a := actor
		a.TenantID, a.Action, a.Resource, a.Outcome = old.TenantID, "compute:templates:update", "template/"+old.ID, "allowed"
		a.Details = map[string]any{"name": t.Name, "image_digest": t.ImageDigest, "runtime": t.Runtime, "warm": t.Warm, "drained": len(drained),
			"secret_refs": EnvRefs(t.Env)}
		return audit.Record(ctx, tx, now, a)
	})
	if err != nil {
		return Template{}, err
	}
	s.deleteManyOnHosts(ctx, actor, drained, 30*time.Second)
	s.bus.Publish(TopicWarm)
	return t, nil
}

// ReasonSecretsChanged is the refusal (CONFLICT) of a template update
// decided on one set of the template's secrets when the template names
// others by the time the update writes.
const ReasonSecretsChanged = "secrets-changed"

// sameSecrets refuses, inside tx, when template old no longer names
// exactly the references decided (ReasonSecretsChanged); a template gone
// meanwhile is NOT_FOUND.
func (s *Service) sameSecrets(ctx context.Context, tx *sql.Tx, old Template, decided []string) error {
	var col string
	err := tx.QueryRowContext(ctx, sqlTemplateEnvCol, old.ID, old.TenantID).Scan(&col)
	if errors.Is(err, sql.ErrNoRows) {
		return errs.New(errs.NotFound, "template not found")
	}
	if err != nil {
		return fmt.Errorf("sandboxes: read template env: %w", err)
	}
	env, err := s.openEnv(old.TenantID, old.ID, col)
	if err != nil {
		return err
	}
	if !slices.Equal(EnvRefs(env), sortedCopy(decided)) {
		return errs.New(errs.Conflict, ReasonSecretsChanged+": the template names other secrets than the update was decided on; read it and update again")
	}
	return nil
}

// sortedCopy returns refs sorted, each once (EnvRefs' form).
func sortedCopy(refs []string) []string {
	out := slices.Clone(refs)
	slices.Sort(out)
	return slices.Compact(out)
}

// ChangesGuest reports whether replacing template old's recipe with in
// changes what its guests run: the image, runtime, limits, network, user
// or environment. Such an update is decided on the template's secrets
// (templates.update in the API). An invalid in answers true (the update
// refuses it anyway).
func ChangesGuest(old Template, in TemplateIn) bool {
	in.Name = old.Name
	t, _, _, err := newTemplate(in, old.ID, old.TenantID, "", old.CreatedAt)
	if err != nil {
		return true
	}
	return t.Image != old.Image || t.Runtime != old.Runtime || t.Limits != old.Limits || t.Network != old.Network ||
		t.Root != old.Root || !maps.Equal(t.Env, old.Env)
}

// DeleteImage deletes an image of tenant by name, with its audit row; an
// image a template of the tenant still names is refused (INVALID_STATE,
// naming the way out). The image's content stays in the store: it is
// content-addressed and may back another tenant's image of the same
// digest, and sandboxes running from it keep running.
func (s *Service) DeleteImage(ctx context.Context, actor audit.Entry, tenant, name string) error {
	now := s.clk.Now()
	return s.db.Tx(ctx, func(tx *sql.Tx) error {
		var digest string
		err := tx.QueryRowContext(ctx, sqlImageOf, tenant, name).Scan(&digest)
		if errors.Is(err, sql.ErrNoRows) {
			return errs.New(errs.NotFound, "image not found")
		}
		if err != nil {
			return fmt.Errorf("sandboxes: read image: %w", err)
		}
		var using int
		if err := tx.QueryRowContext(ctx, sqlTemplatesUsing, tenant, name).Scan(&using); err != nil {
			return fmt.Errorf("sandboxes: read templates: %w", err)
		}
		if using > 0 {
			return errs.New(errs.InvalidState, fmt.Sprintf("%d template(s) use this image: delete or update them first", using))
		}
		if _, err := tx.ExecContext(ctx, sqlDeleteImage, tenant, name); err != nil {
			return fmt.Errorf("sandboxes: delete image: %w", err)
		}
		actor.TenantID, actor.Action, actor.Resource, actor.Outcome = tenant, "compute:images:delete", "image/"+name, "allowed"
		actor.Details = map[string]any{"digest": digest}
		return audit.Record(ctx, tx, now, actor)
	})
}
