package api

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
)

// templateCreateIn is templates.create's input. It stays here, not in
// apitypes, because it is the sandbox module's template input.
type templateCreateIn struct {
	apitypes.TenantIn
	sandboxes.TemplateIn
}

// sandboxMethods are the sandbox module's methods: images (an upload
// begins and is imported here; its bytes stream through the upload
// endpoint, uploads.go), templates and sandboxes. Every method is
// decided on its tenant or on the resource itself; sandboxes.exec is
// decided as compute:sandboxes:exec on the sandbox.
func sandboxMethods(m Modules) []Method {
	if m.Sandboxes == nil {
		return nil
	}
	sbx := func(in apitypes.IDIn) Target { return Target{Kind: "sandbox", ID: in.ID} }
	s := m.Sandboxes
	return append([]Method{
		Def("images.beginUpload", "compute:images:create", true, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			id, err := s.BeginUpload(ctx, c.Actor(), c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return apitypes.UploadBeginOut{UploadID: id, UploadPath: UploadPath + id, MaxBytes: s.MaxImageBytes()}, nil
		}),
		Def("images.import", "compute:images:create", true, func(in apitypes.ImageImportIn) Target { return Target{Kind: "image-upload", ID: in.UploadID} },
			func(ctx context.Context, c *Caller, in apitypes.ImageImportIn) (any, error) {
				return s.CommitImage(ctx, c.Actor(), c.ActingTenant, in.UploadID, in.Name, in.Digest)
			}),
		Def("images.list", "compute:images:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			is, err := s.ListImages(ctx, c.Scope())
			if err != nil {
				return nil, err
			}
			return map[string]any{"images": is}, nil
		}),
		Def("templates.create", "compute:templates:create", true, func(in templateCreateIn) Target { return Target{Tenant: in.TenantID} },
			func(ctx context.Context, c *Caller, in templateCreateIn) (any, error) {
				return createTemplate(ctx, c, s, in)
			}),
		Def("templates.list", "compute:templates:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			return listTemplates(ctx, c, s)
		}),
		Def("templates.get", "compute:templates:get", false, func(in apitypes.IDIn) Target { return Target{Kind: "template", ID: in.ID} },
			func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
				return templateFor(ctx, c, s, in.ID)
			}),
		Def("templates.delete", "compute:templates:delete", true, func(in apitypes.IDIn) Target { return Target{Kind: "template", ID: in.ID} },
			func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
				return s.DeleteTemplate(ctx, c.Actor(), c.ActingTenant, in.ID)
			}),
		Def("sandboxes.create", "compute:sandboxes:create", true, byTenant[apitypes.SandboxCreateIn], func(ctx context.Context, c *Caller, in apitypes.SandboxCreateIn) (any, error) {
			if in.FromCheckpoint != "" {
				return s.CreateFrom(ctx, c.Actor(), c.ActingTenant, in.Template, in.FromCheckpoint)
			}
			return s.Create(ctx, c.Actor(), c.ActingTenant, in.Template)
		}),
		Def("sandboxes.get", "compute:sandboxes:get", false, sbx, func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
			return s.Get(ctx, c.Scope(), in.ID)
		}),
		Def("sandboxes.list", "compute:sandboxes:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			xs, err := s.List(ctx, c.Scope())
			if err != nil {
				return nil, err
			}
			return map[string]any{"sandboxes": xs}, nil
		}),
		Def("sandboxes.extend", "compute:sandboxes:extend", true, func(in apitypes.SandboxExtendIn) Target { return Target{Kind: "sandbox", ID: in.ID} },
			func(ctx context.Context, c *Caller, in apitypes.SandboxExtendIn) (any, error) {
				return s.Extend(ctx, c.Actor(), c.Scope(), in.ID, time.Duration(in.Seconds)*time.Second)
			}),
		Def("sandboxes.delete", "compute:sandboxes:delete", true, sbx, func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
			return s.Delete(ctx, c.Actor(), c.Scope(), in.ID)
		}),
		Def("sandboxes.exec", "compute:sandboxes:exec", true, func(in apitypes.ExecIn) Target { return Target{Kind: "sandbox", ID: in.ID} },
			func(ctx context.Context, c *Caller, in apitypes.ExecIn) (any, error) {
				if in.TimeoutSeconds < 0 || in.TimeoutSeconds > 600 {
					return nil, errs.New(errs.InvalidInput, "timeout_seconds: 0 (30) to 600")
				}
				return s.Exec(ctx, c.Actor(), c.Scope(), in.ID, in.Argv, time.Duration(in.TimeoutSeconds)*time.Second)
			}),
	}, checkpointMethods(s)...)
}

// ActionSecretsManage is the action a template's secret references are
// decided on: naming a secret in a template hands its value to every
// sandbox of the template, so only a caller who may manage the secret can.
const ActionSecretsManage = "compute:secrets:manage"

// decideSecrets decides ActionSecretsManage on each reference, in order;
// the first refused answers ACCESS_DENIED naming it (recorded like the
// envelope's refusals). Whether the secret exists is checked after, by the
// module, so a refusal here tells nothing of it.
func decideSecrets(ctx context.Context, c *Caller, refs []string) error {
	for _, ref := range refs {
		ok, err := c.Allowed(ctx, ActionSecretsManage, "secret/"+ref)
		if err != nil {
			return err
		}
		if !ok {
			return denied(c, ActionSecretsManage, Target{Kind: "secret", ID: ref})
		}
	}
	return nil
}

// createTemplate is templates.create: each secret reference the env
// names is decided (decideSecrets) before the module checks the secrets
// and stores the template.
func createTemplate(ctx context.Context, c *Caller, s *sandboxes.Service, in templateCreateIn) (any, error) {
	if err := decideSecrets(ctx, c, sandboxes.EnvRefs(in.Env)); err != nil {
		return nil, err
	}
	return s.CreateTemplate(ctx, c.Actor(), c.ActingTenant, in.TemplateIn)
}

// listTemplates is templates.list: references are shown, plain env
// values never (templates.get shows those to a caller allowed to manage
// the template).
func listTemplates(ctx context.Context, c *Caller, s *sandboxes.Service) (any, error) {
	ts, err := s.ListTemplates(ctx, c.Scope())
	if err != nil {
		return nil, err
	}
	for i := range ts {
		ts[i] = sandboxes.Redacted(ts[i])
	}
	return map[string]any{"templates": ts}, nil
}

// templateFor is templates.get's answer: the template with its plain env
// values for a caller allowed to update it, redacted for anyone else;
// secret references are shown as references to both.
func templateFor(ctx context.Context, c *Caller, s *sandboxes.Service, id string) (sandboxes.Template, error) {
	t, err := s.Template(ctx, c.Scope(), id)
	if err != nil {
		return sandboxes.Template{}, err
	}
	if len(t.Env) == 0 || len(sandboxes.EnvRefs(t.Env)) == len(t.Env) {
		return t, nil // nothing to redact: no decision, no refusal row
	}
	ok, err := c.Allowed(ctx, "compute:templates:update", "template/"+t.ID)
	if err != nil {
		return sandboxes.Template{}, err
	}
	if !ok {
		return sandboxes.Redacted(t), nil
	}
	return t, nil
}

// checkpointMethods are sandboxes.checkpoint and the checkpoint methods.
// A checkpoint is its sandbox owner's: the checkpoint methods are decided
// on the tenant, and the module answers NOT_FOUND to every other identity
// exactly as for a checkpoint that does not exist (or is another
// tenant's), so neither the tenant nor the id is an existence oracle.
func checkpointMethods(s *sandboxes.Service) []Method {
	return []Method{
		Def("sandboxes.checkpoint", "compute:sandboxes:checkpoint", true, func(in apitypes.SandboxCheckpointIn) Target { return Target{Kind: "sandbox", ID: in.ID} },
			func(ctx context.Context, c *Caller, in apitypes.SandboxCheckpointIn) (any, error) {
				return s.Checkpoint(ctx, c.Actor(), c.Scope(), in.ID, in.Memory)
			}),
		Def("checkpoints.list", "compute:checkpoints:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			cks, err := s.ListCheckpoints(ctx, c.Actor(), c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"checkpoints": cks}, nil
		}),
		Def("checkpoints.delete", "compute:checkpoints:delete", true, byTenant[apitypes.TenantIDIn], func(ctx context.Context, c *Caller, in apitypes.TenantIDIn) (any, error) {
			return s.DeleteCheckpoint(ctx, c.Actor(), c.ActingTenant, in.ID)
		}),
	}
}
