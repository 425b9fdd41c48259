package server

import (
	"context"
	"fmt"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// image stores
	_ "gocloud.dev/blob/memblob"  // mem:// image stores

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
)

// startSandboxes builds the sandbox module, opening its image store when
// one is configured.
func (cp *ControlPlane) startSandboxes(ctx context.Context, o Options) error {
	var bucket *blob.Bucket
	if o.SandboxImages != "" {
		b, err := blob.OpenBucket(ctx, o.SandboxImages)
		if err != nil {
			return errs.Wrap(errs.InvalidConfig, "the sandbox image store does not open", fmt.Errorf("server: %w", err))
		}
		bucket = b
		cp.closers = append(cp.closers, func() { _ = b.Close() })
	}
	cp.Sandboxes = sandboxes.New(o.DB, o.Clock, cp.Bus, cp.Commands, cp.Nodes, cp.Quotas, bucket, o.Log)
	return nil
}
