package sandboxes

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// TestStoreCodecsRoundTrip writes a template, a sandbox, an image and an
// upload with the module's statements and codecs and reads them back, on
// each database.
func TestStoreCodecsRoundTrip(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		now := time.UnixMilli(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixMilli()).UTC()
		tpl, env, labels, err := newTemplate(TemplateIn{Name: "small", Image: "busybox", Root: true, Warm: 2,
			Env: map[string]string{"A": "1"}, Labels: map[string]string{"zone": "a"}}, "tpl_1", iam.RootTenant, "idn_1", now)
		if err != nil {
			t.Fatal(err)
		}
		tpl.ImageDigest = "sha256:" + fmt.Sprintf("%064x", 1)
		if _, err := db.ExecContext(ctx, sqlInsertTemplate, templateArgs(tpl, env, labels, now)...); err != nil {
			t.Fatal(err)
		}
		got, err := scanTemplate(db.QueryRowContext(ctx, sqlSelectTemplates+" "+whereTemplateRef, iam.RootTenant, "small"))
		if err != nil || !reflect.DeepEqual(got, tpl) {
			t.Fatalf("template: %+v, %v\nwant %+v", got, err, tpl)
		}

		x, _, claimed := newSandbox(tpl, "sbx_1", "node_1", "idn_1", false, now)
		if _, err := db.ExecContext(ctx, sqlInsertSandbox, sandboxArgs(x, claimed, now)...); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, sqlSetState, string(StateRunning), "", now.UnixMilli(), x.ID, string(StateStarting)); err != nil {
			t.Fatal(err)
		}
		gx, err := scanSandbox(db.QueryRowContext(ctx, sqlSelectSandboxes+" "+whereClaimedID, x.ID, StateWarm, StateClaiming))
		x.State = StateRunning
		if err != nil || !reflect.DeepEqual(gx, x) {
			t.Fatalf("sandbox: %+v, %v\nwant %+v", gx, err, x)
		}
		var n int
		var mb int64
		var node string
		if err := db.QueryRowContext(ctx, sqlHostLoad, StateStarting, StateWarm, StateClaiming, StateRunning).Scan(&node, &n, &mb); err != nil ||
			node != "node_1" || n != 1 || mb != tpl.Limits.MemoryMB {
			t.Fatalf("host load: %s %d %d %v", node, n, mb, err)
		}

		img := Image{ID: "img_1", TenantID: iam.RootTenant, Name: "busybox", Digest: tpl.ImageDigest, SizeBytes: 3, CreatedBy: "idn_1", CreatedAt: now}
		if _, err := db.ExecContext(ctx, sqlInsertImage, imageArgs(img)...); err != nil {
			t.Fatal(err)
		}
		gi, err := scanImage(db.QueryRowContext(ctx, sqlListImages, iam.RootTenant))
		if err != nil || gi != img {
			t.Fatalf("image: %+v, %v", gi, err)
		}

		if _, err := db.ExecContext(ctx, sqlBeginUpload, "upl_1", iam.RootTenant, "idn_1", now.UnixMilli()); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, sqlAdvanceUpload, int64(spec.MaxEnv), "upl_1", 0); err != nil {
			t.Fatal(err)
		}
		u, err := scanUpload(db.QueryRowContext(ctx, sqlUploadOffset, "upl_1"))
		if err != nil || u.next != spec.MaxEnv || u.done {
			t.Fatalf("upload: %+v, %v", u, err)
		}
		if _, err := db.ExecContext(ctx, sqlFinishUpload, now.UnixMilli(), "upl_1"); err != nil {
			t.Fatal(err)
		}
		if u, err := scanUpload(db.QueryRowContext(ctx, sqlUploadOffset, "upl_1")); err != nil || !u.done {
			t.Fatalf("finished upload: %+v, %v", u, err)
		}
		// An upload is finished once: a second import of it (another
		// process's) changes no row, which CommitImage answers CONFLICT.
		res, err := db.ExecContext(ctx, sqlFinishUpload, now.UnixMilli(), "upl_1")
		if err != nil {
			t.Fatal(err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 0 {
			t.Fatalf("finishing a finished upload changed %d rows (%v)", n, err)
		}
	})
}
