package api

import (
	"context"
	"encoding/base64"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// secretMethods are the sealed secret store's methods. No method returns a
// value: put is write-only.
func secretMethods(m Modules) []Method {
	type putIn struct {
		tenantIn
		Name        string `json:"name" api:"max=128"`
		ValueBase64 string `json:"value_base64" api:"max=65536"`
		Scope       string `json:"scope" api:"max=16"`
	}
	type refIn struct {
		Ref string `json:"ref" api:"max=256"`
	}
	type deleteIn struct {
		Ref   string `json:"ref" api:"max=256"`
		Scope string `json:"scope" api:"max=16"`
	}
	return []Method{
		Def("secrets.put", "compute:secrets:manage", true, byTenant[putIn], func(ctx context.Context, c *Caller, in putIn) (any, error) {
			v, err := base64.StdEncoding.DecodeString(in.ValueBase64)
			if err != nil {
				return nil, errs.New(errs.InvalidInput, "value_base64: not base64")
			}
			defer clear(v)
			return m.Secrets.Put(ctx, c.Actor(), c.ActingTenant, in.Name, in.Scope, v)
		}),
		Def("secrets.list", "compute:secrets:list", false, byTenant[tenantIn], func(ctx context.Context, c *Caller, _ tenantIn) (any, error) {
			ms, err := m.Secrets.List(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"secrets": ms}, nil
		}),
		Def("secrets.get", "compute:secrets:get", false, func(in refIn) Target { return Target{Kind: "secret", ID: in.Ref} },
			func(ctx context.Context, c *Caller, in refIn) (any, error) { return m.Secrets.Show(ctx, in.Ref) }),
		Def("secrets.delete", "compute:secrets:manage", true, func(in deleteIn) Target { return Target{Kind: "secret", ID: in.Ref} },
			func(ctx context.Context, c *Caller, in deleteIn) (any, error) {
				return map[string]any{}, m.Secrets.Delete(ctx, c.Actor(), in.Ref, in.Scope)
			}),
	}
}
