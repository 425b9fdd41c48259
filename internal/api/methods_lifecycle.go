package api

import (
	"context"
	"slices"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
)

// lifecycleMethods are the methods that end what other methods made, and
// whoami: roles.delete, joinTokens.list and revoke, nodes.delete,
// commands.cancel and identities.whoami. tenants.delete's teardown is
// deleteTenant.
func lifecycleMethods(m Modules) []Method {
	return append([]Method{
		Def("identities.whoami", "compute:whoami:get", false, nil, func(ctx context.Context, c *Caller, _ struct{}) (any, error) {
			return whoami(ctx, m, c)
		}),
		Def("roles.delete", "compute:roles:delete", true, byTenant[apitypes.TenantIDIn], func(ctx context.Context, c *Caller, in apitypes.TenantIDIn) (any, error) {
			if in.ID == "" {
				return nil, errs.New(errs.InvalidInput, "id is required")
			}
			n, err := m.IAM.DeleteRole(ctx, c.Actor(), c.ActingTenant, in.ID)
			if err != nil {
				return nil, err
			}
			return map[string]any{"id": in.ID, "bindings_deleted": n}, nil
		}),
		Def("joinTokens.list", "compute:join-tokens:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			ts, err := m.Nodes.ListJoinTokens(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"join_tokens": ts}, nil
		}),
		Def("joinTokens.revoke", "compute:join-tokens:revoke", true, byTenant[apitypes.TenantIDIn], func(ctx context.Context, c *Caller, in apitypes.TenantIDIn) (any, error) {
			if in.ID == "" {
				return nil, errs.New(errs.InvalidInput, "id is required")
			}
			if err := m.Nodes.RevokeJoinToken(ctx, c.Actor(), c.ActingTenant, in.ID); err != nil {
				return nil, err
			}
			return map[string]any{"id": in.ID, "state": "revoked"}, nil
		}),
		Def("nodes.delete", "compute:nodes:delete", true, byID("node"), func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
			n, err := m.Nodes.Delete(ctx, c.Actor(), in.ID)
			if err != nil {
				return nil, err
			}
			return map[string]any{"id": in.ID, "deleted": true, "certificates_revoked": n}, nil
		}),
		Def("commands.cancel", "compute:commands:cancel", true, byID("command"), func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
			return m.Commands.Cancel(ctx, c.Actor(), c.Scope(), in.ID)
		}),
	}, sandboxLifecycleMethods(m)...)
}

// templateUpdateIn is templates.update's input: the template (id or
// name) and its new recipe. It stays here, not in apitypes, because the
// recipe is the sandbox module's template input.
type templateUpdateIn struct {
	ID string `json:"id" api:"max=64"`
	sandboxes.TemplateIn
}

// sandboxLifecycleMethods are templates.update and images.delete (none
// without the sandbox module).
func sandboxLifecycleMethods(m Modules) []Method {
	if m.Sandboxes == nil {
		return nil
	}
	return []Method{
		Def("templates.update", "compute:templates:update", true, func(in templateUpdateIn) Target { return Target{Kind: "template", ID: in.ID} },
			func(ctx context.Context, c *Caller, in templateUpdateIn) (any, error) {
				return updateTemplate(ctx, c, m.Sandboxes, in)
			}),
		Def("images.delete", "compute:images:delete", true, byTenant[apitypes.ImageDeleteIn], func(ctx context.Context, c *Caller, in apitypes.ImageDeleteIn) (any, error) {
			if in.Name == "" {
				return nil, errs.New(errs.InvalidInput, "name is required")
			}
			if err := m.Sandboxes.DeleteImage(ctx, c.Actor(), c.ActingTenant, in.Name); err != nil {
				return nil, err
			}
			return map[string]any{"name": in.Name, "deleted": true}, nil
		}),
	}
}

// updateTemplate is templates.update: the new recipe's secret references
// are decided (compute:secrets:manage) as a create's are, and an update
// that changes what the guest runs (sandboxes.ChangesGuest) is decided on
// the secrets the template names now too, even when the new recipe names
// none. The module refuses the write (CONFLICT, secrets-changed) if the
// template names other secrets by then.
func updateTemplate(ctx context.Context, c *Caller, s *sandboxes.Service, in templateUpdateIn) (any, error) {
	old, err := s.Template(ctx, c.Scope(), in.ID)
	if err != nil {
		return nil, err
	}
	oldRefs := sandboxes.EnvRefs(old.Env)
	refs := sandboxes.EnvRefs(in.Env)
	if sandboxes.ChangesGuest(old, in.TemplateIn) {
		for _, r := range oldRefs {
			if !slices.Contains(refs, r) {
				refs = append(refs, r)
			}
		}
	}
	if err := decideSecrets(ctx, c, refs); err != nil {
		return nil, err
	}
	return s.UpdateTemplate(ctx, c.Actor(), c.ActingTenant, in.ID, in.TemplateIn, oldRefs)
}

// whoami answers who the caller's credential speaks for.
func whoami(ctx context.Context, m Modules, c *Caller) (apitypes.Whoami, error) {
	id, err := m.IAM.Identity(ctx, c.Identity)
	if err != nil {
		return apitypes.Whoami{}, err
	}
	out := apitypes.Whoami{IdentityID: c.Identity, IdentityName: id.Name, Kind: id.Kind, TenantID: c.HomeTenant,
		KeyID: c.KeyID, SessionID: c.SessionID, Scopes: append([]string{}, c.Scopes...)}
	if !c.ExpiresAt.IsZero() {
		exp := c.ExpiresAt.UTC()
		out.ExpiresAt = &exp
	}
	return out, nil
}

// tenantDeleter is tenants.delete's handler: deleteTenant.
func tenantDeleter(m Modules) func(context.Context, *Caller, apitypes.IDIn) (any, error) {
	return func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
		return deleteTenant(ctx, m, c, in.ID)
	}
}

// deleteTenant deletes tenant id and every tenant below it, deepest
// first, and tears each down through its owners' APIs: tenant id is
// marked deleted first (every caller in its subtree is refused from then
// on), then for each tenant the
// sandbox module deletes its templates, warm pools and sandboxes, the
// nodes module revokes its nodes' certificates and unused join tokens,
// and the API key module revokes its keys and sessions. Each step writes
// its own audit row. A tenant already deleted is torn down again (each
// step is idempotent), so a teardown cut short is finished by deleting
// it once more.
func deleteTenant(ctx context.Context, m Modules, c *Caller, id string) (apitypes.TenantDeleted, error) {
	if iam.IsRoot(id) {
		return apitypes.TenantDeleted{}, errs.New(errs.InvalidState, "the root tenant cannot be suspended or deleted")
	}
	// The tenant is marked deleted before its subtree is read, so no
	// tenant made below it meanwhile escapes: every caller in the subtree
	// is refused from then on (an ancestor is deleted).
	if _, err := m.IAM.SetTenantState(ctx, c.Actor(), id, iam.StateDeleted); err != nil && errs.CodeOf(err) != errs.InvalidState {
		return apitypes.TenantDeleted{}, err
	}
	tree, err := m.IAM.ListTenants(ctx, id)
	if err != nil {
		return apitypes.TenantDeleted{}, err
	}
	if len(tree) == 0 {
		return apitypes.TenantDeleted{}, errs.New(errs.NotFound, "tenant not found")
	}
	out := apitypes.TenantDeleted{ID: id, State: iam.StateDeleted}
	for _, t := range deepestFirst(tree) {
		if err := teardownOne(ctx, m, c, t, &out); err != nil {
			return out, err
		}
		out.TenantsDeleted++
	}
	return out, nil
}

// teardownOne deletes one tenant t (its children already gone) and adds
// what it ended to out.
func teardownOne(ctx context.Context, m Modules, c *Caller, t iam.Tenant, out *apitypes.TenantDeleted) error {
	actor := c.Actor()
	if t.State != iam.StateDeleted {
		actor.TenantID = t.ParentID
		if _, err := m.IAM.SetTenantState(ctx, actor, t.ID, iam.StateDeleted); err != nil {
			return err
		}
	}
	actor.TenantID = t.ID
	if m.Sandboxes != nil {
		tpls, xs, err := m.Sandboxes.Teardown(ctx, actor, t.ID)
		if err != nil {
			return err
		}
		out.TemplatesDeleted, out.SandboxesDeleted = out.TemplatesDeleted+tpls, out.SandboxesDeleted+xs
	}
	certs, tokens, err := m.Nodes.EndTenancy(ctx, actor, t.ID)
	if err != nil {
		return err
	}
	out.CertificatesRevoked, out.JoinTokensRevoked = out.CertificatesRevoked+certs, out.JoinTokensRevoked+tokens
	keys, sessions, err := m.Keys.RevokeTenant(ctx, actor, t.ID)
	if err != nil {
		return err
	}
	out.KeysRevoked, out.SessionsRevoked = out.KeysRevoked+keys, out.SessionsRevoked+sessions
	return nil
}

// deepestFirst orders a subtree (as ListTenants gives it: by depth, the
// tenant first) so that every tenant comes after all the tenants below it.
func deepestFirst(tree []iam.Tenant) []iam.Tenant {
	out := slices.Clone(tree)
	slices.Reverse(out)
	return out
}
