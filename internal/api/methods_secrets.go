package api

import (
	"context"
	"encoding/base64"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// secretMethods are the sealed secret store's methods. No method returns a
// value: put is write-only.
func secretMethods(m Modules) []Method {
	return []Method{
		Def("secrets.put", "compute:secrets:manage", true, byTenant[apitypes.SecretPutIn], func(ctx context.Context, c *Caller, in apitypes.SecretPutIn) (any, error) {
			v, err := base64.StdEncoding.DecodeString(in.ValueBase64)
			if err != nil {
				return nil, errs.New(errs.InvalidInput, "value_base64: not base64")
			}
			defer clear(v)
			return m.Secrets.Put(ctx, c.Actor(), c.ActingTenant, in.Name, in.Scope, v)
		}),
		Def("secrets.list", "compute:secrets:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			ms, err := m.Secrets.List(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"secrets": ms}, nil
		}),
		Def("secrets.get", "compute:secrets:get", false, func(in apitypes.SecretRefIn) Target { return Target{Kind: "secret", ID: in.Ref} },
			func(ctx context.Context, c *Caller, in apitypes.SecretRefIn) (any, error) {
				return m.Secrets.Show(ctx, in.Ref)
			}),
		Def("secrets.delete", "compute:secrets:manage", true, func(in apitypes.SecretDeleteIn) Target { return Target{Kind: "secret", ID: in.Ref} },
			func(ctx context.Context, c *Caller, in apitypes.SecretDeleteIn) (any, error) {
				return map[string]any{}, m.Secrets.Delete(ctx, c.Actor(), in.Ref, in.Scope)
			}),
	}
}
