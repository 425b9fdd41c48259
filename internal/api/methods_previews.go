package api

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previews"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// previewMethods are sandboxes.preview, decided
// compute:sandboxes:preview on the sandbox (another tenant's answers as a
// missing one), and previews.rotateKey, decided on the root tenant.
func previewMethods(m Modules) []Method {
	if m.Previews == nil {
		return nil
	}
	p := m.Previews
	return []Method{
		Def("sandboxes.preview", tickets.ActionSandboxPreview, true, func(in apitypes.SandboxPreviewIn) Target { return Target{Kind: "sandbox", ID: in.ID} },
			func(ctx context.Context, c *Caller, in apitypes.SandboxPreviewIn) (any, error) {
				if in.TTLSeconds < 0 || in.TTLSeconds > int64(previews.MaxTTL/time.Second) {
					return nil, errs.New(errs.InvalidInput, "ttl_seconds: 60 to 86400 (0: 3600)")
				}
				return p.Issue(ctx, c.Actor(), c.Scope(), in.ID, in.Port, time.Duration(in.TTLSeconds)*time.Second)
			}).ShownOnce(),
		Def("previews.rotateKey", previews.ActionRotateKey, true, func(struct{}) Target { return Target{Tenant: iam.RootTenant} },
			func(ctx context.Context, c *Caller, _ struct{}) (any, error) {
				kid, err := p.RotateKey(ctx, c.Actor())
				if err != nil {
					return nil, err
				}
				return apitypes.PreviewKeyOut{KeyID: kid}, nil
			}),
	}
}
