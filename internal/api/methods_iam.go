package api

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// ActionKeysForOthers is the action, on resource "identity/<id>", that
// apiKeys.create needs beyond compute:api-keys:create to make a key for an
// identity other than the caller's own.
const ActionKeysForOthers = "compute:api-keys:create-for-others"

// roleCreateIn is roles.create's input. It stays here, not in apitypes,
// because its statements are the IAM module's type.
type roleCreateIn struct {
	apitypes.TenantIn
	Name       string          `json:"name" api:"max=63"`
	Statements []iam.Statement `json:"statements" api:"items=64"`
}

// iamMethods are tenants, identities, roles, bindings and API keys.
func iamMethods(m Modules) []Method {
	tenantByID := func(in apitypes.IDIn) Target { return Target{Kind: "tenant", ID: in.ID} }
	setState := func(state string) func(context.Context, *Caller, apitypes.IDIn) (any, error) {
		return func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
			return m.IAM.SetTenantState(ctx, c.Actor(), in.ID, state)
		}
	}
	return []Method{
		Def("tenants.create", "compute:tenants:create", true, func(in apitypes.TenantCreateIn) Target { return Target{Tenant: in.ParentID} },
			func(ctx context.Context, c *Caller, in apitypes.TenantCreateIn) (any, error) {
				return m.IAM.CreateTenant(ctx, c.Actor(), c.ActingTenant, in.Name)
			}),
		Def("tenants.list", "compute:tenants:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			ts, err := m.IAM.ListTenants(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"tenants": ts}, nil
		}),
		// A tenant is read in its own tree: a caller may get its own tenant
		// and those below it.
		Def("tenants.get", "compute:tenants:get", false, func(in apitypes.IDIn) Target { return Target{Tenant: in.ID} }, func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
			chain, err := m.IAM.Chain(ctx, in.ID)
			if err != nil || len(chain) == 0 {
				return nil, errs.New(errs.NotFound, "tenant not found")
			}
			return chain[0], nil
		}),
		Def("tenants.suspend", "compute:tenants:suspend", true, tenantByID, setState(iam.StateSuspended)),
		Def("tenants.resume", "compute:tenants:resume", true, tenantByID, setState(iam.StateActive)),
		Def("tenants.delete", "compute:tenants:delete", true, tenantByID, tenantDeleter(m)),
		Def("identities.create", "compute:identities:create", true, byTenant[apitypes.IdentityCreateIn], func(ctx context.Context, c *Caller, in apitypes.IdentityCreateIn) (any, error) {
			if in.For == "" {
				return m.IAM.CreateIdentity(ctx, c.Actor(), c.ActingTenant, in.Name, in.Kind)
			}
			// An agent acting for a person: its delegation is made with it.
			if in.Kind != "agent" {
				return nil, errs.New(errs.InvalidInput, "for: only an identity of kind agent acts for a person")
			}
			return m.IAM.CreateAgentFor(ctx, c.Actor(), c.ActingTenant, in.Name, in.For)
		}),
		Def("identities.list", "compute:identities:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			is, err := m.IAM.ListIdentities(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"identities": is}, nil
		}),
		Def("identities.delete", "compute:identities:delete", true, byTenant[apitypes.TenantIDIn], func(ctx context.Context, c *Caller, in apitypes.TenantIDIn) (any, error) {
			if in.ID == "" {
				return nil, errs.New(errs.InvalidInput, "id is required")
			}
			return map[string]any{}, m.IAM.DeleteIdentity(ctx, c.Actor(), c.ActingTenant, in.ID)
		}),
		// A suspended identity is refused every call until resumed; the
		// agents acting for a suspended person too.
		Def("identities.suspend", "compute:identities:suspend", true, byTenant[apitypes.TenantIDIn], setSuspended(m, true)),
		Def("identities.resume", "compute:identities:resume", true, byTenant[apitypes.TenantIDIn], setSuspended(m, false)),
		Def("roles.create", "compute:roles:create", true, byTenant[roleCreateIn], func(ctx context.Context, c *Caller, in roleCreateIn) (any, error) {
			return m.IAM.CreateRole(ctx, c.Actor(), c.ActingTenant, in.Name, in.Statements)
		}),
		Def("roles.list", "compute:roles:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			rs, err := m.IAM.ListRoles(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"roles": rs}, nil
		}),
		Def("bindings.create", "compute:bindings:create", true, byTenant[apitypes.BindIn], func(ctx context.Context, c *Caller, in apitypes.BindIn) (any, error) {
			id, err := m.IAM.Bind(ctx, c.Actor(), c.ActingTenant, in.IdentityID, in.RoleID)
			if err != nil {
				return nil, err
			}
			return apitypes.IDOut{ID: id}, nil
		}),
		Def("bindings.list", "compute:bindings:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			bs, err := m.IAM.ListBindings(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"bindings": bs}, nil
		}),
		Def("bindings.delete", "compute:bindings:delete", true, byTenant[apitypes.TenantIDIn], func(ctx context.Context, c *Caller, in apitypes.TenantIDIn) (any, error) {
			return map[string]any{}, m.IAM.Unbind(ctx, c.Actor(), c.ActingTenant, in.ID)
		}),
		Def("apiKeys.create", "compute:api-keys:create", true, byTenant[apitypes.APIKeyCreateIn], func(ctx context.Context, c *Caller, in apitypes.APIKeyCreateIn) (any, error) {
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
					return nil, denied(c, ActionKeysForOthers, Target{Kind: "identity", ID: in.IdentityID})
				}
			}
			// The new key expires no later than the caller's credential.
			id, key, exp, err := m.Keys.CreateFor(ctx, c.Actor(), c.Principal, c.ActingTenant, in.IdentityID, in.Name, time.Duration(in.TTLSeconds)*time.Second, in.Scopes...)
			if err != nil {
				return nil, err
			}
			out := apitypes.APIKey{ID: id, Key: key, TenantID: c.ActingTenant, IdentityID: in.IdentityID}
			if !exp.IsZero() {
				utc := exp.UTC()
				out.ExpiresAt = &utc
			}
			return out, nil
		}),
		Def("apiKeys.list", "compute:api-keys:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			ks, err := m.Keys.List(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"api_keys": ks}, nil
		}),
		Def("apiKeys.revoke", "compute:api-keys:revoke", true, func(in apitypes.IDIn) Target { return Target{Kind: "api-key", ID: in.ID} },
			func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
				return map[string]any{}, m.Keys.Revoke(ctx, c.Actor(), c.ActingTenant, in.ID)
			}),
		Def("sessions.create", "compute:sessions:create", true, nil, func(ctx context.Context, c *Caller, _ struct{}) (any, error) {
			// At most 12 h, and never past the caller's key or session.
			ss, err := m.Keys.CreateSession(ctx, c.Actor(), c.Principal, apikeys.SessionLifetime)
			if err != nil {
				return nil, err
			}
			return apitypes.Session{Cookie: SessionCookie, ExpiresAt: ss.ExpiresAt.UTC(), ID: ss.ID, Value: ss.Value}, nil
		}),
		Def("sessions.revoke", "compute:sessions:revoke", true, byTenant[apitypes.TenantIDIn], func(ctx context.Context, c *Caller, in apitypes.TenantIDIn) (any, error) {
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

// setSuspended is identities.suspend (suspend true) or identities.resume.
func setSuspended(m Modules, suspend bool) func(context.Context, *Caller, apitypes.TenantIDIn) (any, error) {
	return func(ctx context.Context, c *Caller, in apitypes.TenantIDIn) (any, error) {
		if in.ID == "" {
			return nil, errs.New(errs.InvalidInput, "id is required")
		}
		return map[string]any{}, m.IAM.SetSuspended(ctx, c.Actor(), c.ActingTenant, in.ID, suspend)
	}
}
