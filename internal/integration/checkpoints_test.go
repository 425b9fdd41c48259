package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/checkpoint"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// checkpointOut is what sandboxes.checkpoint answers.
type checkpointOut struct {
	ID           string `json:"id"`
	Owner        string `json:"owner"`
	SandboxID    string `json:"sandbox_id"`
	ImageDigest  string `json:"image_digest"`
	Digest       string `json:"digest"`
	Size         int64  `json:"size"`
	MemoryDigest string `json:"memory_digest"`
}

// TestSandboxCheckpointRestoreOnAnotherHost: a file written in a sandbox
// survives a checkpoint and a restore on another host of the tenant; the
// restore runs under the checkpoint's own template; a checkpoint's
// objects outlive its deletion while a sandbox restored from it lives,
// and are purged after.
func TestSandboxCheckpointRestoreOnAnotherHost(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		rt := sandboxRuntime(t)
		t.Logf("runtime %s", rt)
		e := testenv.Start(t, db, testenv.Options{Nodes: 2, SandboxRuntime: rt})
		_, admin := e.TenantAdmin(t, "acme")
		importSmallTemplate(t, e, admin, rt, 0)
		ctx := context.Background()
		x, err := admin.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatal(err)
		}
		if rt != spec.RuntimeSim {
			if r, err := admin.Exec(ctx, x.ID, []string{"sh", "-c", "mkdir -p /tmp/work && echo kept > /tmp/work/note"}, 10); err != nil || r.ExitCode != 0 {
				t.Fatalf("write: %+v %v", r, err)
			}
		}
		var ck checkpointOut
		if err := admin.Call(ctx, "sandboxes.checkpoint", map[string]any{"id": x.ID}, &ck); err != nil {
			t.Fatalf("checkpoint: %v", err)
		}
		if !spec.ValidDigest(ck.Digest) || ck.Size <= 0 || ck.SandboxID != x.ID || ck.MemoryDigest != "" {
			t.Fatalf("checkpoint answered %+v", ck)
		}
		if err := admin.Call(ctx, "sandboxes.checkpoint", map[string]any{"id": x.ID, "memory": true}, nil); rt != spec.RuntimeRunsc && !errors.Is(err, client.ErrInvalidInput) {
			t.Fatalf("a memory checkpoint on %s: %v, want INVALID_INPUT", rt, err)
		}
		if _, err := admin.DeleteSandbox(ctx, x.ID); err != nil {
			t.Fatal(err)
		}
		// The first host goes away: the restore can only land on the other.
		first := nodeIndex(t, e, x.NodeID)
		e.Nodes[first].Stop()
		e.Nodes[first].WaitDisconnected(t)
		waitDisconnectedInRegistry(t, e, x.NodeID)
		var y client.Sandbox
		if err := admin.Call(ctx, "sandboxes.create", map[string]any{"from_checkpoint": ck.ID}, &y); err != nil {
			t.Fatalf("restore: %v", err)
		}
		if y.NodeID == x.NodeID || y.State != sandboxes.StateRunning {
			t.Fatalf("restored %+v on %s", y, x.NodeID)
		}
		if rt != spec.RuntimeSim {
			if r, err := admin.Exec(ctx, y.ID, []string{"cat", "/tmp/work/note"}, 10); err != nil || string(r.Stdout) != "kept\n" {
				t.Fatalf("the restored file: %q %v", r.Stdout, err)
			}
			if r, err := admin.Exec(ctx, y.ID, []string{"sh", "-c", "echo more >> /tmp/work/note"}, 10); err != nil || r.ExitCode != 0 {
				t.Fatalf("the restored sandbox's user cannot write its files: %+v %v", r, err)
			}
		}
		checkPurge(t, e, admin, ck, y.ID)
	})
}

// checkPurge deletes checkpoint ck while sandbox live restores from it:
// its object stays until live is deleted, then the purge removes it.
func checkPurge(t *testing.T, e *testenv.Env, admin *client.Client, ck checkpointOut, live string) {
	t.Helper()
	ctx := context.Background()
	st, err := checkpoint.OpenStore(ctx, e.ImageStore())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := admin.Call(ctx, "checkpoints.delete", map[string]any{"id": ck.ID}, nil); err != nil {
		t.Fatalf("delete checkpoint: %v", err)
	}
	if err := admin.Call(ctx, "sandboxes.create", map[string]any{"from_checkpoint": ck.ID}, nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("restore of a deleted checkpoint: %v, want NOT_FOUND", err)
	}
	if _, err := e.CP.Sandboxes.PurgeCheckpoints(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.Exists(ctx, ck.Digest); err != nil || !ok {
		t.Fatalf("the object of a checkpoint a live sandbox restores from was purged: %v %v", ok, err)
	}
	if _, err := admin.DeleteSandbox(ctx, live); err != nil {
		t.Fatal(err)
	}
	// The workers' loop may purge at the same time: whichever purge marked
	// the checkpoint has removed its object once this one returns.
	if n, err := e.CP.Sandboxes.PurgeCheckpoints(ctx); err != nil || n > 1 {
		t.Fatalf("purge: %d %v, want at most 1", n, err)
	}
	if ok, err := st.Exists(ctx, ck.Digest); err != nil || ok {
		t.Fatalf("a deleted checkpoint nothing uses still has its object: %v %v", ok, err)
	}
}

// nodeIndex is the index in e.Nodes of node id.
func nodeIndex(t *testing.T, e *testenv.Env, id string) int {
	t.Helper()
	for i, n := range e.Nodes {
		if n.NodeID() == id {
			return i
		}
	}
	t.Fatalf("no node %s", id)
	return -1
}

// TestSandboxCheckpointsAreTheOwners: a checkpoint belongs to the
// sandbox's owner whoever took it; to another identity of the same tenant
// and to another tenant, restoring, listing and deleting it answer
// exactly as for a checkpoint that does not exist (NOT_FOUND); a restore
// names no other template.
func TestSandboxCheckpointsAreTheOwners(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeSim})
	tenant, admin := e.TenantAdmin(t, "acme")
	importSmallTemplate(t, e, admin, spec.RuntimeSim, 0)
	colleague := e.IdentityClient(t, tenant, "colleague", "admin")
	_, stranger := e.TenantAdmin(t, "other")
	ctx := context.Background()
	x, err := admin.CreateSandbox(ctx, "", "small")
	if err != nil {
		t.Fatal(err)
	}
	// The colleague takes it; it is still the owner's.
	var ck checkpointOut
	if err := colleague.Call(ctx, "sandboxes.checkpoint", map[string]any{"id": x.ID}, &ck); err != nil {
		t.Fatalf("checkpoint by a colleague: %v", err)
	}
	me, _ := admin.Whoami(ctx)
	if ck.Owner != me.IdentityID {
		t.Fatalf("owner %q, want the sandbox's owner %q", ck.Owner, me.IdentityID)
	}
	var list struct{ Checkpoints []checkpointOut }
	if err := colleague.Call(ctx, "checkpoints.list", map[string]any{}, &list); err != nil || len(list.Checkpoints) != 0 {
		t.Fatalf("the colleague lists %+v %v", list, err)
	}
	if err := admin.Call(ctx, "checkpoints.list", map[string]any{}, &list); err != nil || len(list.Checkpoints) != 1 || list.Checkpoints[0].ID != ck.ID {
		t.Fatalf("the owner lists %+v %v", list, err)
	}
	missing := "ckpaaaaaaaaaaaaaaaa"
	calls := map[string]func(c *client.Client, id string) error{
		"restore": func(c *client.Client, id string) error {
			return c.Call(ctx, "sandboxes.create", map[string]any{"from_checkpoint": id}, nil)
		},
		"delete": func(c *client.Client, id string) error {
			return c.Call(ctx, "checkpoints.delete", map[string]any{"id": id}, nil)
		},
	}
	for name, call := range calls {
		for who, c := range map[string]*client.Client{"colleague": colleague, "stranger": stranger} {
			theirs, none := call(c, ck.ID), call(c, missing)
			var e1, e2 *client.Error
			if !errors.As(theirs, &e1) || !errors.As(none, &e2) || e1.Code != "NOT_FOUND" ||
				e1.Code != e2.Code || e1.Message != e2.Message || e1.Status != e2.Status {
				t.Fatalf("%s by the %s: the owner's checkpoint answers %v, a missing one %v", name, who, theirs, none)
			}
		}
	}
	if err := admin.Call(ctx, "templates.create", map[string]any{"name": "other-tpl", "image": "busybox", "runtime": spec.RuntimeSim}, nil); err != nil {
		t.Fatal(err)
	}
	if err := admin.Call(ctx, "sandboxes.create", map[string]any{"template": "other-tpl", "from_checkpoint": ck.ID}, nil); !errors.Is(err, client.ErrInvalidInput) {
		t.Fatalf("a restore under another template: %v, want INVALID_INPUT", err)
	}
	var y client.Sandbox
	if err := admin.Call(ctx, "sandboxes.create", map[string]any{"template": "small", "from_checkpoint": ck.ID}, &y); err != nil || y.TemplateID != x.TemplateID {
		t.Fatalf("the owner's restore: %+v %v", y, err)
	}
}

// TestSandboxRestoreRunsUnderItsCheckpoint: a restore runs with the image,
// runtime, network mode and user its checkpoint was taken under, even
// after the template changed them (memory captured under network none
// never resumes with egress), and the limits and lifetime the template
// has now.
func TestSandboxRestoreRunsUnderItsCheckpoint(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeSim})
	tenant, admin := e.TenantAdmin(t, "acme")
	importSmallTemplate(t, e, admin, spec.RuntimeSim, 0)
	ctx := context.Background()
	if _, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, tenant, "spare", tinyTar(t)); err != nil {
		t.Fatal(err)
	}
	x, err := admin.CreateSandbox(ctx, "", "small")
	if err != nil {
		t.Fatal(err)
	}
	before, _ := e.Nodes[0].Sandbox.Get(x.ID)
	var ck checkpointOut
	if err := admin.Call(ctx, "sandboxes.checkpoint", map[string]any{"id": x.ID}, &ck); err != nil {
		t.Fatal(err)
	}
	// The template now runs another image, as root, with egress (which
	// this fleet cannot place), and other limits.
	if err := admin.Call(ctx, "templates.update", map[string]any{"id": x.TemplateID, "image": "spare", "runtime": spec.RuntimeSim,
		"network": "egress", "root": true, "limits": map[string]any{"cpu_millis": 250, "memory_mb": 64, "pids": 32, "disk_mb": 16}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateSandbox(ctx, "", "small"); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("a new sandbox of the changed template: %v, want INVALID_STATE (no egress host)", err)
	}
	var y client.Sandbox
	if err := admin.Call(ctx, "sandboxes.create", map[string]any{"from_checkpoint": ck.ID}, &y); err != nil {
		t.Fatalf("restore: %v", err)
	}
	got, ok := e.Nodes[0].Sandbox.Get(y.ID)
	if !ok || got.ImageDigest != before.ImageDigest || got.Network != spec.NetworkNone || got.Root || got.Limits.MemoryMB != 64 || got.FromCheckpoint != ck.Digest {
		t.Fatalf("restored as %+v; taken from %+v", got, before)
	}
}

// TestSandboxCheckpointsOfADeletedOwnerAreDropped: a checkpoint is its
// owner's alone; when the owner identity is deleted, nobody inherits its
// checkpoints: they are dropped (and purged), and another owner's are
// kept.
func TestSandboxCheckpointsOfADeletedOwnerAreDropped(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeSim})
	tenant, admin := e.TenantAdmin(t, "acme")
	importSmallTemplate(t, e, admin, spec.RuntimeSim, 0)
	leaver := e.IdentityClient(t, tenant, "leaver", "admin")
	ctx := context.Background()
	cks := map[string]checkpointOut{}
	for who, c := range map[string]*client.Client{"admin": admin, "leaver": leaver} {
		x, err := c.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatal(err)
		}
		var ck checkpointOut
		if err := c.Call(ctx, "sandboxes.checkpoint", map[string]any{"id": x.ID}, &ck); err != nil {
			t.Fatal(err)
		}
		if _, err := c.DeleteSandbox(ctx, x.ID); err != nil {
			t.Fatal(err)
		}
		cks[who] = ck
	}
	me, _ := leaver.Whoami(ctx)
	if err := admin.Call(ctx, "identities.delete", map[string]any{"id": me.IdentityID}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.CP.Sandboxes.PurgeCheckpoints(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := e.CP.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandbox_checkpoints WHERE deleted_at IS NULL AND owner_id = $1`, me.IdentityID).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the deleted owner keeps %d checkpoints (%v)", n, err)
	}
	var list struct{ Checkpoints []checkpointOut }
	if err := admin.Call(ctx, "checkpoints.list", map[string]any{}, &list); err != nil || len(list.Checkpoints) != 1 || list.Checkpoints[0].ID != cks["admin"].ID {
		t.Fatalf("the remaining owner lists %+v %v", list, err)
	}
}
