package sandboxes

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
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
		s := &Service{kek: pki.KEK{1}}
		envCol, err := s.sealEnv(tpl.TenantID, tpl.ID, env)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, sqlInsertTemplate, templateArgs(tpl, envCol, labels, now)...); err != nil {
			t.Fatal(err)
		}
		got, err := scanTemplate(db.QueryRowContext(ctx, sqlSelectTemplates+" "+whereTemplateRef, iam.RootTenant, "small"))
		if err == nil {
			got.Env, err = s.openEnv(got.TenantID, got.ID, got.envCol)
			got.envCol = ""
		}
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

// TestTemplateEnvSealed: a template's env column is sealed (no plain
// value or reference in it), opens only as the template it was sealed
// for (another template id or tenant does not open it) and only under
// its KEK; a plain column written before sealing still reads.
func TestTemplateEnvSealed(t *testing.T) {
	s := &Service{kek: pki.KEK{7}}
	col, err := s.sealEnv("tabc", "tpl_1", []byte(`{"A":"plain-value","B":"secret://tabc/db"}`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(col, "plain-value") || strings.Contains(col, "secret://") || !strings.HasPrefix(col, sealedEnvPrefix) {
		t.Fatalf("column %q is not sealed", col)
	}
	env, err := s.openEnv("tabc", "tpl_1", col)
	if err != nil || env["A"] != "plain-value" || env["B"] != "secret://tabc/db" {
		t.Fatalf("opened %v %v", env, err)
	}
	for name, open := range map[string]func() error{
		"other template": func() error { _, err := s.openEnv("tabc", "tpl_2", col); return err },
		"other tenant":   func() error { _, err := s.openEnv("tother", "tpl_1", col); return err },
		"other kek":      func() error { _, err := (&Service{kek: pki.KEK{8}}).openEnv("tabc", "tpl_1", col); return err },
	} {
		if open() == nil {
			t.Errorf("%s: the sealed env opened", name)
		}
	}
	if env, err := s.openEnv("tabc", "tpl_1", `{"A":"old"}`); err != nil || env["A"] != "old" {
		t.Fatalf("legacy plain column: %v %v", env, err)
	}
	if _, err := (&Service{}).sealEnv("tabc", "tpl_1", []byte(`{}`)); errs.CodeOf(err) != errs.InvalidConfig {
		t.Fatalf("seal without a KEK: %v", err)
	}
}

// TestRedactedAndRefs: Redacted hides every plain value and keeps every
// reference; EnvRefs names each reference once, sorted, and nothing
// else (a reference inside a longer value is not one).
func TestRedactedAndRefs(t *testing.T) {
	tpl := Template{Env: map[string]string{"A": "plain", "B": "secret://tabc/db", "C": "secret://tabc/api", "D": "secret://tabc/db", "E": "x secret://tabc/z"}}
	r := Redacted(tpl)
	want := map[string]string{"A": RedactedValue, "B": "secret://tabc/db", "C": "secret://tabc/api", "D": "secret://tabc/db", "E": RedactedValue}
	if !reflect.DeepEqual(r.Env, want) || tpl.Env["A"] != "plain" {
		t.Fatalf("redacted %v (original %v)", r.Env, tpl.Env)
	}
	if got := EnvRefs(tpl.Env); !reflect.DeepEqual(got, []string{"secret://tabc/api", "secret://tabc/db"}) {
		t.Fatalf("refs %q", got)
	}
}
