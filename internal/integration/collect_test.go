package integration

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"gocloud.dev/blob"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestSandboxObjectsCollected: the collector removes an image object no
// image name, template, live sandbox or kept checkpoint names, and an
// upload left unfinished past its time; it keeps the image a checkpoint
// still needs after its name and template are gone, and removes nothing
// younger than the grace.
func TestSandboxObjectsCollected(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		clk := clock.NewFake(time.Now())
		e := testenv.Start(t, db, testenv.Options{Nodes: 1, Clock: clk, SandboxRuntime: spec.RuntimeSim})
		tenant, admin := e.TenantAdmin(t, "acme")
		importSmallTemplate(t, e, admin, spec.RuntimeSim, 0)
		ctx := context.Background()
		actor := audit.Entry{TenantID: tenant, Actor: "test"}
		spare, err := e.CP.Sandboxes.ImportBytes(ctx, actor, tenant, "spare", tinyTar(t))
		if err != nil {
			t.Fatal(err)
		}
		x, err := admin.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatal(err)
		}
		var ck checkpointOut
		if err := admin.Call(ctx, "sandboxes.checkpoint", map[string]any{"id": x.ID}, &ck); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.DeleteSandbox(ctx, x.ID); err != nil {
			t.Fatal(err)
		}
		// The checkpoint's image loses its name and template.
		for _, c := range []struct {
			method string
			in     map[string]any
		}{
			{"templates.delete", map[string]any{"id": x.TemplateID}},
			{"images.delete", map[string]any{"name": "busybox"}},
			{"images.delete", map[string]any{"name": "spare"}},
		} {
			if err := admin.Call(ctx, c.method, c.in, nil); err != nil {
				t.Fatalf("%s %v: %v", c.method, c.in, err)
			}
		}
		up, err := e.CP.Sandboxes.BeginUpload(ctx, actor, tenant)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.CP.Sandboxes.WriteUpload(ctx, actor, up, 0, bytes.NewReader([]byte("half an image"))); err != nil {
			t.Fatal(err)
		}
		bkt, err := blob.OpenBucket(ctx, e.ImageStore())
		if err != nil {
			t.Fatal(err)
		}
		defer bkt.Close()
		// The workers' own loop may collect too: the test asserts what
		// the store holds, not who removed it.
		expect := func(when string, want map[string]bool) {
			t.Helper()
			if _, err := e.CP.Sandboxes.CollectObjects(ctx); err != nil {
				t.Fatalf("%s: collect: %v", when, err)
			}
			for key, keep := range want {
				if ok, err := bkt.Exists(ctx, key); err != nil || ok != keep {
					t.Fatalf("%s: %s exists %v (%v), want %v", when, key, ok, err, keep)
				}
			}
		}
		part := "staging/" + up + "/0000000000000000"
		spareKey, ckImage := spec.ImageKey(spare.Digest), spec.ImageKey(ck.ImageDigest)
		expect("within the grace", map[string]bool{spareKey: true, ckImage: true, part: true})
		clk.Advance(sandboxes.UploadTTL + time.Minute)
		expect("past the grace", map[string]bool{spareKey: false, ckImage: true, part: false})
		if _, err := e.CP.Sandboxes.UploadOffset(ctx, up); errs.CodeOf(err) != errs.NotFound {
			t.Fatalf("the collected upload: %v, want NOT_FOUND", err)
		}
	})
}

// tinyTar is an image of one empty directory.
func tinyTar(t *testing.T) []byte {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(dir+"/etc", 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := imagetar.FromDir(dir, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
