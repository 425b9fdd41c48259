package integration

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// templates.update replaces a template's recipe under its id, drains the
// warm sandboxes made from the old recipe and refills from the new one;
// images.delete refuses an image a template names and deletes it once
// none does. Another tenant's template answers as a missing one (the one
// denial) and another tenant's image as a missing one (NOT_FOUND), and
// neither is touched.
func TestTemplateUpdateAndImageDelete(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e, rt := startQuotaSandboxes(t, db, quota.Defaults())
		ctx := context.Background()
		tenantA, a := tenantWithImage(t, e, "upd-a")
		_, b := tenantWithImage(t, e, "upd-b")
		tpl, err := createTemplate(a, rt, "pool", 64, 1)
		if err != nil {
			t.Fatal(err)
		}
		waitWarm(t, sandboxEnv{Env: e}, tpl, 1)
		oldWarm := warmIDs(t, db, tpl)

		update := map[string]any{"id": tpl, "image": "busybox", "runtime": rt, "warm": 2, "lifetime_seconds": 600, "max_lifetime_seconds": 1200,
			"limits": map[string]any{"cpu_millis": 100, "memory_mb": 128, "pids": 64, "disk_mb": 32}}
		if err := b.Call(ctx, "templates.update", update, nil); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("another tenant's update: %v, want ACCESS_DENIED", err)
		}
		missing := map[string]any{"id": "tplzzzzzzzzzzzzzz", "image": "busybox"}
		var missErr, foreignErr *client.Error
		errors.As(b.Call(ctx, "templates.update", missing, nil), &missErr)
		errors.As(b.Call(ctx, "templates.update", update, nil), &foreignErr)
		if missErr == nil || foreignErr == nil || missErr.Code != foreignErr.Code ||
			// A denial names the id the caller gave: compare without it.
			strings.ReplaceAll(missErr.Message, "tplzzzzzzzzzzzzzz", "ID") != strings.ReplaceAll(foreignErr.Message, tpl, "ID") {
			t.Fatalf("foreign %v, missing %v: not one answer", foreignErr, missErr)
		}
		if err := a.Call(ctx, "templates.update", map[string]any{"id": tpl, "name": "renamed", "image": "busybox"}, nil); !errors.Is(err, client.ErrInvalidInput) {
			t.Fatalf("a rename: %v, want INVALID_INPUT", err)
		}
		var got struct {
			ID     string
			Warm   int
			Limits struct {
				MemoryMB int64 `json:"memory_mb"`
			}
		}
		// The new recipe (2 × 128 MiB) is admitted against the warm-pool
		// quota as a new template: past the limit it is refused and the
		// template stays; at exactly the limit it fits, as the old recipe
		// (64 MiB) no longer counts.
		setQuotas(t, e, tenantA, client.QuotaOverrides{WarmMemoryMB: client.Limit(255)})
		if err := a.Call(ctx, "templates.update", update, nil); !errors.Is(err, client.ErrResourceExhausted) {
			t.Fatalf("an update past the warm-pool quota: %v, want RESOURCE_EXHAUSTED", err)
		}
		for _, id := range oldWarm {
			if st := sandboxState(t, db, id); st != "warm" {
				t.Fatalf("warm sandbox %s is %s after a refused update", id, st)
			}
		}
		setQuotas(t, e, tenantA, client.QuotaOverrides{WarmMemoryMB: client.Limit(256)})
		if err := a.Call(ctx, "templates.update", update, &got); err != nil || got.ID != tpl || got.Warm != 2 || got.Limits.MemoryMB != 128 {
			t.Fatalf("update: %+v %v", got, err)
		}
		for _, id := range oldWarm {
			if st := sandboxState(t, db, id); st != "deleted" {
				t.Fatalf("warm sandbox %s of the old recipe is %s", id, st)
			}
		}
		waitWarm(t, sandboxEnv{Env: e}, tpl, 2)

		// Images: in use, then free; another tenant's is as missing.
		if err := a.DeleteImage(ctx, "", "busybox"); !errors.Is(err, client.ErrInvalidState) {
			t.Fatalf("deleting an image in use: %v, want INVALID_STATE", err)
		}
		if _, _, err := a.DeleteTemplate(ctx, tpl); err != nil {
			t.Fatal(err)
		}
		if err := a.DeleteImage(ctx, "", "busybox"); err != nil {
			t.Fatalf("images.delete: %v", err)
		}
		var imgs struct{ Images []struct{ Name string } }
		if err := a.Call(ctx, "images.list", map[string]any{}, &imgs); err != nil || len(imgs.Images) != 0 {
			t.Fatalf("images left: %+v %v", imgs, err)
		}
		errAgain := a.DeleteImage(ctx, "", "busybox")
		errNever := a.DeleteImage(ctx, "", "never-was")
		var again, never *client.Error
		if !errors.As(errAgain, &again) || !errors.As(errNever, &never) || again.Code != "NOT_FOUND" || again.Message != never.Message {
			t.Fatalf("deleting again %v, a name never imported %v: want one NOT_FOUND", errAgain, errNever)
		}
		// B's image of the same name was never A's to delete.
		if err := b.Call(ctx, "images.list", map[string]any{}, &imgs); err != nil || len(imgs.Images) != 1 {
			t.Fatalf("tenant B's images: %+v %v", imgs, err)
		}
	})
}

// warmIDs are the ids of a template's warm sandboxes.
func warmIDs(t *testing.T, db *store.DB, tpl string) []string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT id FROM sandboxes WHERE template_id = $1 AND state = 'warm'`, tpl)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out = append(out, id)
	}
	if len(out) == 0 {
		t.Fatal("no warm sandbox")
	}
	return out
}

// sandboxState is a sandbox's state as its row holds it.
func sandboxState(t *testing.T, db *store.DB, id string) string {
	t.Helper()
	var st string
	if err := db.QueryRowContext(context.Background(), `SELECT state FROM sandboxes WHERE id = $1`, id).Scan(&st); err != nil {
		t.Fatal(err)
	}
	return st
}
