package api

import (
	"context"
	"encoding/base64"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
)

// sandboxMethods are the sandbox module's methods: images (chunked
// uploads through the envelope), templates and sandboxes. Every method is
// decided on its tenant or on the resource itself; sandboxes.exec is
// decided as compute:sandboxes:exec on the sandbox.
func sandboxMethods(m Modules) []Method {
	if m.Sandboxes == nil {
		return nil
	}
	type chunkIn struct {
		UploadID   string `json:"upload_id" api:"max=64"`
		Offset     int64  `json:"offset" api:"min=0,max=2147483648"`
		DataBase64 string `json:"data_base64" api:"max=54620"`
	}
	type importIn struct {
		UploadID string `json:"upload_id" api:"max=64"`
		Name     string `json:"name" api:"max=128"`
		Digest   string `json:"digest" api:"max=71"`
	}
	type templateIn struct {
		tenantIn
		sandboxes.TemplateIn
	}
	type templateRef struct {
		ID string `json:"id" api:"max=64"`
	}
	type createIn struct {
		tenantIn
		Template string `json:"template" api:"max=64"`
	}
	type sandboxRef struct {
		ID string `json:"id" api:"max=64"`
	}
	type extendIn struct {
		ID      string `json:"id" api:"max=64"`
		Seconds int64  `json:"seconds" api:"min=60,max=604800"`
	}
	type execIn struct {
		ID             string   `json:"id" api:"max=64"`
		Argv           []string `json:"argv" api:"items=256,max=16384"`
		TimeoutSeconds int64    `json:"timeout_seconds" api:"min=0,max=600"`
	}
	upload := func(in chunkIn) Target { return Target{Kind: "image-upload", ID: in.UploadID} }
	sbx := func(in sandboxRef) Target { return Target{Kind: "sandbox", ID: in.ID} }
	s := m.Sandboxes
	return []Method{
		Def("images.beginUpload", "compute:images:create", true, byTenant[tenantIn], func(ctx context.Context, c *Caller, _ tenantIn) (any, error) {
			id, err := s.BeginUpload(ctx, c.Actor(), c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"upload_id": id, "max_chunk": sandboxes.MaxChunk}, nil
		}),
		Def("images.uploadChunk", "compute:images:create", true, upload, func(ctx context.Context, c *Caller, in chunkIn) (any, error) {
			data, err := base64.StdEncoding.DecodeString(in.DataBase64)
			if err != nil {
				return nil, errs.New(errs.InvalidInput, "data_base64: not base64")
			}
			next, err := s.PutChunk(ctx, c.Actor(), in.UploadID, in.Offset, data)
			if err != nil {
				return nil, err
			}
			return map[string]any{"next_offset": next}, nil
		}),
		Def("images.import", "compute:images:create", true, func(in importIn) Target { return Target{Kind: "image-upload", ID: in.UploadID} },
			func(ctx context.Context, c *Caller, in importIn) (any, error) {
				return s.CommitImage(ctx, c.Actor(), c.ActingTenant, in.UploadID, in.Name, in.Digest)
			}),
		Def("images.list", "compute:images:list", false, byTenant[tenantIn], func(ctx context.Context, c *Caller, _ tenantIn) (any, error) {
			is, err := s.ListImages(ctx, iam.ScopeOf(c.ActingTenant))
			if err != nil {
				return nil, err
			}
			return map[string]any{"images": is}, nil
		}),
		Def("templates.create", "compute:templates:create", true, func(in templateIn) Target { return Target{Tenant: in.TenantID} },
			func(ctx context.Context, c *Caller, in templateIn) (any, error) {
				return s.CreateTemplate(ctx, c.Actor(), c.ActingTenant, in.TemplateIn)
			}),
		Def("templates.list", "compute:templates:list", false, byTenant[tenantIn], func(ctx context.Context, c *Caller, _ tenantIn) (any, error) {
			ts, err := s.ListTemplates(ctx, iam.ScopeOf(c.ActingTenant))
			if err != nil {
				return nil, err
			}
			return map[string]any{"templates": ts}, nil
		}),
		Def("templates.get", "compute:templates:get", false, func(in templateRef) Target { return Target{Kind: "template", ID: in.ID} },
			func(ctx context.Context, c *Caller, in templateRef) (any, error) {
				return s.Template(ctx, iam.ScopeOf(c.ActingTenant), in.ID)
			}),
		Def("templates.delete", "compute:templates:delete", true, func(in templateRef) Target { return Target{Kind: "template", ID: in.ID} },
			func(ctx context.Context, c *Caller, in templateRef) (any, error) {
				return s.DeleteTemplate(ctx, c.Actor(), c.ActingTenant, in.ID)
			}),
		Def("sandboxes.create", "compute:sandboxes:create", true, byTenant[createIn], func(ctx context.Context, c *Caller, in createIn) (any, error) {
			return s.Create(ctx, c.Actor(), c.ActingTenant, in.Template)
		}),
		Def("sandboxes.get", "compute:sandboxes:get", false, sbx, func(ctx context.Context, c *Caller, in sandboxRef) (any, error) {
			return s.Get(ctx, iam.ScopeOf(c.ActingTenant), in.ID)
		}),
		Def("sandboxes.list", "compute:sandboxes:list", false, byTenant[tenantIn], func(ctx context.Context, c *Caller, _ tenantIn) (any, error) {
			xs, err := s.List(ctx, iam.ScopeOf(c.ActingTenant))
			if err != nil {
				return nil, err
			}
			return map[string]any{"sandboxes": xs}, nil
		}),
		Def("sandboxes.extend", "compute:sandboxes:extend", true, func(in extendIn) Target { return Target{Kind: "sandbox", ID: in.ID} },
			func(ctx context.Context, c *Caller, in extendIn) (any, error) {
				return s.Extend(ctx, c.Actor(), iam.ScopeOf(c.ActingTenant), in.ID, time.Duration(in.Seconds)*time.Second)
			}),
		Def("sandboxes.delete", "compute:sandboxes:delete", true, sbx, func(ctx context.Context, c *Caller, in sandboxRef) (any, error) {
			return s.Delete(ctx, c.Actor(), iam.ScopeOf(c.ActingTenant), in.ID)
		}),
		Def("sandboxes.exec", "compute:sandboxes:exec", true, func(in execIn) Target { return Target{Kind: "sandbox", ID: in.ID} },
			func(ctx context.Context, c *Caller, in execIn) (any, error) {
				if in.TimeoutSeconds < 0 || in.TimeoutSeconds > 600 {
					return nil, errs.New(errs.InvalidInput, "timeout_seconds: 0 (30) to 600")
				}
				return s.Exec(ctx, c.Actor(), iam.ScopeOf(c.ActingTenant), in.ID, in.Argv, time.Duration(in.TimeoutSeconds)*time.Second)
			}),
	}
}
