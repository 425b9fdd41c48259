package api

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// ActionKeysForOthers is the action, on resource "identity/<id>", that
// apiKeys.create needs beyond compute:api-keys:create to make a key for an
// identity other than the caller's own.
const ActionKeysForOthers = "compute:api-keys:create-for-others"

// iamMethods are tenants, identities, roles, bindings and API keys.
func iamMethods(m Modules) []Method {
	type tenantCreateIn struct {
		ParentID string `json:"parent_id" api:"max=64"`
		Name     string `json:"name" api:"max=63"`
	}
	type idIn struct {
		ID string `json:"id" api:"max=64"`
	}
	type identityIn struct {
		tenantIn
		Name string `json:"name" api:"max=63"`
		Kind string `json:"kind" api:"max=32"`
	}
	type roleIn struct {
		tenantIn
		Name       string          `json:"name" api:"max=63"`
		Statements []iam.Statement `json:"statements" api:"items=64"`
	}
	type bindIn struct {
		tenantIn
		IdentityID string `json:"identity_id" api:"max=64"`
		RoleID     string `json:"role_id" api:"max=64"`
	}
	type unbindIn struct {
		tenantIn
		ID string `json:"id" api:"max=64"`
	}
	type keyIn struct {
		tenantIn
		IdentityID string   `json:"identity_id" api:"max=64"`
		Name       string   `json:"name" api:"max=128"`
		TTLSeconds int64    `json:"ttl_seconds" api:"min=0,max=31622400"`
		Scopes     []string `json:"scopes" api:"items=64,max=128"`
	}
	// sessionIn names one session (or identity) of a tenant.
	type sessionIn struct {
		tenantIn
		ID string `json:"id" api:"max=64"`
	}
	tenantByID := func(in idIn) Target { return Target{Kind: "tenant", ID: in.ID} }
	setState := func(state string) func(context.Context, *Caller, idIn) (any, error) {
		return func(ctx context.Context, c *Caller, in idIn) (any, error) {
			return m.IAM.SetTenantState(ctx, c.Actor(), in.ID, state)
		}
	}
	return []Method{
		Def("tenants.create", "compute:tenants:create", true, func(in tenantCreateIn) Target { return Target{Tenant: in.ParentID} },
			func(ctx context.Context, c *Caller, in tenantCreateIn) (any, error) {
				return m.IAM.CreateTenant(ctx, c.Actor(), c.ActingTenant, in.Name)
			}),
		Def("tenants.list", "compute:tenants:list", false, byTenant[tenantIn], func(ctx context.Context, c *Caller, _ tenantIn) (any, error) {
			ts, err := m.IAM.ListTenants(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"tenants": ts}, nil
		}),
		// A tenant is read in its own tree: a caller may get its own tenant
		// and those below it.
		Def("tenants.get", "compute:tenants:get", false, func(in idIn) Target { return Target{Tenant: in.ID} }, func(ctx context.Context, c *Caller, in idIn) (any, error) {
			chain, err := m.IAM.Chain(ctx, in.ID)
			if err != nil || len(chain) == 0 {
				return nil, errs.New(errs.NotFound, "tenant not found")
			}
			return chain[0], nil
		}),
		Def("tenants.suspend", "compute:tenants:suspend", true, tenantByID, setState(iam.StateSuspended)),
		Def("tenants.resume", "compute:tenants:resume", true, tenantByID, setState(iam.StateActive)),
		Def("tenants.delete", "compute:tenants:delete", true, tenantByID, setState(iam.StateDeleted)),
		Def("identities.create", "compute:identities:create", true, byTenant[identityIn], func(ctx context.Context, c *Caller, in identityIn) (any, error) {
			return m.IAM.CreateIdentity(ctx, c.Actor(), c.ActingTenant, in.Name, in.Kind)
		}),
		Def("identities.list", "compute:identities:list", false, byTenant[tenantIn], func(ctx context.Context, c *Caller, _ tenantIn) (any, error) {
			is, err := m.IAM.ListIdentities(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"identities": is}, nil
		}),
		Def("identities.delete", "compute:identities:delete", true, byTenant[sessionIn], func(ctx context.Context, c *Caller, in sessionIn) (any, error) {
			if in.ID == "" {
				return nil, errs.New(errs.InvalidInput, "id is required")
			}
			return map[string]any{}, m.IAM.DeleteIdentity(ctx, c.Actor(), c.ActingTenant, in.ID)
		}),
		Def("roles.create", "compute:roles:create", true, byTenant[roleIn], func(ctx context.Context, c *Caller, in roleIn) (any, error) {
			return m.IAM.CreateRole(ctx, c.Actor(), c.ActingTenant, in.Name, in.Statements)
		}),
		Def("roles.list", "compute:roles:list", false, byTenant[tenantIn], func(ctx context.Context, c *Caller, _ tenantIn) (any, error) {
			rs, err := m.IAM.ListRoles(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"roles": rs}, nil
		}),
		Def("bindings.create", "compute:bindings:create", true, byTenant[bindIn], func(ctx context.Context, c *Caller, in bindIn) (any, error) {
			id, err := m.IAM.Bind(ctx, c.Actor(), c.ActingTenant, in.IdentityID, in.RoleID)
			if err != nil {
				return nil, err
			}
			return map[string]any{"id": id}, nil
		}),
		Def("bindings.list", "compute:bindings:list", false, byTenant[tenantIn], func(ctx context.Context, c *Caller, _ tenantIn) (any, error) {
			bs, err := m.IAM.ListBindings(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"bindings": bs}, nil
		}),
		Def("bindings.delete", "compute:bindings:delete", true, byTenant[unbindIn], func(ctx context.Context, c *Caller, in unbindIn) (any, error) {
			return map[string]any{}, m.IAM.Unbind(ctx, c.Actor(), c.ActingTenant, in.ID)
		}),
		Def("apiKeys.create", "compute:api-keys:create", true, byTenant[keyIn], func(ctx context.Context, c *Caller, in keyIn) (any, error) {
			if in.IdentityID == "" {
				return nil, errs.New(errs.InvalidInput, "identity_id is required")
			}
			if in.TTLSeconds < 0 {
				return nil, errs.New(errs.InvalidInput, "ttl_seconds must not be negative")
			}
			// A key for another identity speaks for it: that needs its own
			// action (the built-in admin role has it; operator and viewer
			// do not), decided before anything about the identity is read.
			if in.IdentityID != c.Identity {
				ok, err := c.Allowed(ctx, ActionKeysForOthers, "identity/"+in.IdentityID)
				if err != nil {
					return nil, err
				}
				if !ok {
					return nil, errDenied
				}
			}
			// The new key expires no later than the caller's credential.
			id, key, exp, err := m.Keys.CreateFor(ctx, c.Actor(), c.Principal, c.ActingTenant, in.IdentityID, in.Name, time.Duration(in.TTLSeconds)*time.Second, in.Scopes...)
			if err != nil {
				return nil, err
			}
			out := map[string]any{"id": id, "key": key, "tenant_id": c.ActingTenant, "identity_id": in.IdentityID}
			if !exp.IsZero() {
				out["expires_at"] = exp.UTC()
			}
			return out, nil
		}),
		Def("apiKeys.list", "compute:api-keys:list", false, byTenant[tenantIn], func(ctx context.Context, c *Caller, _ tenantIn) (any, error) {
			ks, err := m.Keys.List(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"api_keys": ks}, nil
		}),
		Def("apiKeys.revoke", "compute:api-keys:revoke", true, func(in idIn) Target { return Target{Kind: "api-key", ID: in.ID} },
			func(ctx context.Context, c *Caller, in idIn) (any, error) {
				return map[string]any{}, m.Keys.Revoke(ctx, c.Actor(), c.ActingTenant, in.ID)
			}),
		Def("sessions.create", "compute:sessions:create", true, nil, func(ctx context.Context, c *Caller, _ struct{}) (any, error) {
			// At most 12 h, and never past the caller's key or session.
			ss, err := m.Keys.CreateSession(ctx, c.Actor(), c.Principal, apikeys.SessionLifetime)
			if err != nil {
				return nil, err
			}
			return map[string]any{"id": ss.ID, "cookie": SessionCookie, "value": ss.Value, "expires_at": ss.ExpiresAt.UTC()}, nil
		}),
		Def("sessions.revoke", "compute:sessions:revoke", true, byTenant[sessionIn], func(ctx context.Context, c *Caller, in sessionIn) (any, error) {
			id := in.ID
			if id == "" {
				// No id: the calling session itself (sign out).
				if c.SessionID == "" || c.ActingTenant != c.HomeTenant {
					return nil, errs.New(errs.InvalidInput, "id is required")
				}
				id = c.SessionID
			}
			return map[string]any{}, m.Keys.RevokeSession(ctx, c.Actor(), c.ActingTenant, id)
		}),
	}
}
