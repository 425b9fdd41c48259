package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// putTenantSecret puts name in the caller's tenant through the API and
// returns its reference.
func putTenantSecret(t *testing.T, c *client.Client, name string, value []byte) string {
	t.Helper()
	var m struct{ Ref string }
	if err := c.Call(context.Background(), "secrets.put", map[string]any{"name": name, "value_base64": base64.StdEncoding.EncodeToString(value)}, &m); err != nil {
		t.Fatalf("secrets.put: %v", err)
	}
	return m.Ref
}

// secretTemplate is templates.create's input for a template whose env
// is env.
func secretTemplate(rt, name string, env map[string]string, warm int) map[string]any {
	return map[string]any{"name": name, "image": "busybox", "runtime": rt,
		"limits": map[string]any{"cpu_millis": 100, "memory_mb": 64, "pids": 64, "disk_mb": 32}, "lifetime_seconds": 600,
		"max_lifetime_seconds": 1200, "env": env, "warm": warm}
}

// hostEnv runs env in sandbox id directly on the node's host (so its
// output, which holds the value, never enters a command result) and
// returns it.
func hostEnv(t *testing.T, n *testenv.Node, id string) string {
	t.Helper()
	raw, _ := json.Marshal(spec.Exec{SandboxID: id, Argv: []string{"env"}, TimeoutMS: 10000})
	out, err := n.Sandbox.Exec(context.Background(), raw)
	if err != nil {
		t.Fatalf("env in the sandbox: %v", err)
	}
	var res spec.ExecResult
	if err := json.Unmarshal(out, &res); err != nil || res.ExitCode != 0 {
		t.Fatalf("env in the sandbox: %+v %v", res, err)
	}
	return string(res.Stdout)
}

// TestSandboxSecretEnv: a template's env names a secret the tenant put;
// a sandbox of it sees the value in env (and an API exec finds it set),
// while the value appears raw, in base64 or in hex nowhere else: not in
// the SQLite database file, any file under the control plane's and the
// node's data folders (read while the sandbox runs), the logs, or an
// API answer (templates.get shows the reference).
func TestSandboxSecretEnv(t *testing.T) {
	dir := t.TempDir()
	db, err := store.Open(context.Background(), "sqlite:"+filepath.Join(dir, "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	rt := sandboxRuntime(t)
	e := testenv.Start(t, db, testenv.Options{Nodes: 1, SandboxRuntime: rt, LogTo: logs})
	ctx := context.Background()
	_, admin := tenantWithImage(t, e, "envco")
	value := []byte("s3cr3t-" + ids.Secret(24))
	ref := putTenantSecret(t, admin, "db", value)
	var tpl sandboxes.Template
	if err := admin.Call(ctx, "templates.create", secretTemplate(rt, "withsecret", map[string]string{"DB_PASSWORD": ref, "GREETING": "hi"}, 0), &tpl); err != nil {
		t.Fatalf("templates.create: %v", err)
	}
	var answers []json.RawMessage
	var got json.RawMessage
	if err := admin.Call(ctx, "templates.get", map[string]any{"id": tpl.ID}, &got); err != nil {
		t.Fatal(err)
	}
	answers = append(answers, got)
	var shown sandboxes.Template
	if err := json.Unmarshal(got, &shown); err != nil || shown.Env["DB_PASSWORD"] != ref || shown.Env["GREETING"] != "hi" {
		t.Fatalf("templates.get env %v (%v): want the reference and the plain value", shown.Env, err)
	}
	x, err := admin.CreateSandbox(ctx, "", "withsecret")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	env := hostEnv(t, e.Nodes[0], x.ID)
	if !strings.Contains(env, "DB_PASSWORD="+string(value)+"\n") || !strings.Contains(env, "GREETING=hi\n") || strings.Contains(env, ref) {
		t.Fatalf("env in the sandbox does not hold the value (or holds the reference)")
	}
	// Through the API too: the exec answers only whether it is set.
	res, err := admin.Exec(ctx, x.ID, []string{"sh", "-c", `test "${#DB_PASSWORD}" = ` + strconv.Itoa(len(value))}, 30)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("API exec: %+v %v", res, err)
	}
	var releases int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE action = 'compute:secrets:release' AND resource = $1`, ref).Scan(&releases); err != nil || releases != 1 {
		t.Fatalf("%d release audit rows (%v), want 1", releases, err)
	}
	forms := [][]byte{value, []byte(base64.StdEncoding.EncodeToString(value)), []byte(hex.EncodeToString(value))}
	check := func(where string, b []byte) {
		for _, f := range forms {
			if bytes.Contains(b, f) {
				t.Fatalf("the secret value appears in %s", where)
			}
		}
	}
	scan := func(root string) {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			b, err := os.ReadFile(p)
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed meanwhile (a temporary file)
			}
			if err != nil {
				return err
			}
			check(p, b)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if rt == spec.RuntimeRunc {
		// A process started in the sandbox holds the value in its
		// environment: while a terminal runs there, no file of the host's
		// (its process spec included) holds it.
		sh, err := e.Nodes[0].Sandbox.OpenShell(ctx, x.ID, []string{"sh"})
		if err != nil {
			t.Fatalf("shell: %v", err)
		}
		scan(e.Dir)
		// runc as root keeps bundles under RunBase (the sandbox's mounts
		// are in them): its own files are the bundle's top level.
		top, _ := filepath.Glob(filepath.Join(sandbox.RunBase, "*", "bundles", x.ID, "*"))
		for _, p := range top {
			if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				check(p, b)
			}
		}
		if len(top) == 0 && os.Geteuid() == 0 {
			t.Fatal("no bundle of the sandbox under RunBase")
		}
		sh.Close()
	}
	scan(e.Dir) // while the sandbox runs: the node's state, runtime state and journal
	for _, a := range answers {
		check("an API answer", a)
	}
	e.Close()
	scan(dir) // the database file (and its WAL)
	scan(e.Dir)
	check("the logs", logs.Bytes())
}

// refusal asserts err is code with a message starting with prefix and
// returns the message.
func refusal(t *testing.T, what string, err error, code, prefix string) string {
	t.Helper()
	gotCode, msg := string(errs.CodeOf(err)), errs.SafeMessage(err)
	if ce := (*client.Error)(nil); errors.As(err, &ce) {
		gotCode, msg = ce.Code, ce.Message
	}
	if err == nil || gotCode != code || !strings.HasPrefix(msg, prefix) {
		t.Fatalf("%s: %v, want %s %q", what, err, code, prefix)
	}
	return msg
}

// TestTemplateSecretRefusals: naming a secret in a template decides
// compute:secrets:manage; the secret must be a live one the template's
// tenant put, and another tenant's, a fleet secret and a missing one get
// the one same refusal; a value holding a reference inside it is
// refused; templates.get redacts plain values for a caller who may not
// update the template (references stay), templates.list for everyone; an
// update that changes what the guest runs is decided on the secrets the
// template names even when the new recipe names none; a new sandbox
// re-checks the template's secrets.
func TestTemplateSecretRefusals(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		rt := sandboxRuntime(t)
		e := testenv.Start(t, db, testenv.Options{Nodes: 1, SandboxRuntime: rt})
		ctx := context.Background()
		tenantA, a := tenantWithImage(t, e, "sec-a")
		_, b := tenantWithImage(t, e, "sec-b")
		refA := putTenantSecret(t, a, "db", []byte("value-a"))
		refB := putTenantSecret(t, b, "db", []byte("value-b"))
		fleet := "secret://root/fleetdb"
		if err := e.Client.Call(ctx, "secrets.put", map[string]any{"name": "fleetdb", "scope": "fleet", "value_base64": base64.StdEncoding.EncodeToString([]byte("f"))}, nil); err != nil {
			t.Fatal(err)
		}
		missing := strings.Replace(refA, "/db", "/nope", 1)
		create := func(c *client.Client, name string, env map[string]string) error {
			return c.Call(ctx, "templates.create", secretTemplate(rt, name, env, 0), nil)
		}
		msgB := refusal(t, "another tenant's secret", create(a, "t1", map[string]string{"DB": refB}), "INVALID_INPUT", "env DB: "+sandboxes.ReasonSecretUnknown)
		msgM := refusal(t, "a missing secret", create(a, "t1", map[string]string{"DB": missing}), "INVALID_INPUT", "env DB: "+sandboxes.ReasonSecretUnknown)
		msgF := refusal(t, "a fleet secret", create(a, "t1", map[string]string{"DB": fleet}), "INVALID_INPUT", "env DB: "+sandboxes.ReasonSecretUnknown)
		if msgB != msgM || msgF != msgM {
			t.Fatalf("not one answer: %q, %q, %q", msgB, msgM, msgF)
		}
		if _, err := e.CP.Sandboxes.ImportBytes(ctx, admin, "root", "busybox", busyboxTar(t)); err != nil {
			t.Fatal(err)
		}
		refusal(t, "a fleet secret in the root tenant", create(e.Client, "t1", map[string]string{"DB": fleet}), "INVALID_INPUT", "env DB: "+sandboxes.ReasonSecretUnknown)
		refusal(t, "a reference inside a value", create(a, "t1", map[string]string{"DB": "x " + refA}), "INVALID_INPUT", "env DB: a value naming a secret must be exactly")

		// A role that manages templates but not secrets.
		var role struct{ ID string }
		if err := a.Call(ctx, "roles.create", map[string]any{"tenant_id": tenantA, "name": "templater", "statements": []map[string]any{
			{"effect": "allow", "actions": []string{"compute:templates:*", "compute:*:get", "compute:*:list"}, "resources": []string{"*"}},
		}}, &role); err != nil {
			t.Fatal(err)
		}
		templater := e.IdentityClient(t, tenantA, "templater", role.ID)
		viewer := e.IdentityClient(t, tenantA, "viewer", "viewer")
		refusal(t, "no compute:secrets:manage", create(templater, "t1", map[string]string{"DB": refA}), "ACCESS_DENIED", "compute:secrets:manage on secret "+refA)
		refusal(t, "no compute:secrets:manage, missing secret", create(templater, "t1", map[string]string{"DB": missing}), "ACCESS_DENIED", "compute:secrets:manage on secret "+missing)

		var tpl sandboxes.Template
		if err := a.Call(ctx, "templates.create", secretTemplate(rt, "t1", map[string]string{"DB": refA, "GREETING": "hi"}, 0), &tpl); err != nil {
			t.Fatal(err)
		}
		get := func(c *client.Client) map[string]string {
			var got sandboxes.Template
			if err := c.Call(ctx, "templates.get", map[string]any{"id": tpl.ID}, &got); err != nil {
				t.Fatal(err)
			}
			return got.Env
		}
		if env := get(a); env["GREETING"] != "hi" || env["DB"] != refA {
			t.Fatalf("admin sees %v", env)
		}
		if env := get(viewer); env["GREETING"] != sandboxes.RedactedValue || env["DB"] != refA {
			t.Fatalf("viewer sees %v: want the plain value redacted, the reference shown", env)
		}
		var list struct{ Templates []sandboxes.Template }
		if err := a.Call(ctx, "templates.list", map[string]any{}, &list); err != nil || len(list.Templates) != 1 ||
			list.Templates[0].Env["GREETING"] != sandboxes.RedactedValue || list.Templates[0].Env["DB"] != refA {
			t.Fatalf("templates.list %+v %v", list, err)
		}

		// Item 8: updates decided on the template's secrets.
		upd := secretTemplate(rt, "", map[string]string{"GREETING": "hello"}, 0)
		upd["id"] = tpl.ID
		refusal(t, "an update dropping the secret, changing the guest", templater.Call(ctx, "templates.update", upd, nil), "ACCESS_DENIED", "compute:secrets:manage on secret "+refA)
		same := secretTemplate(rt, "", map[string]string{"DB": refA, "GREETING": "hi"}, 0)
		same["id"] = tpl.ID
		refusal(t, "an update naming the secret", templater.Call(ctx, "templates.update", same, nil), "ACCESS_DENIED", "compute:secrets:manage on secret "+refA)
		// Decided on other secrets than the template names by the write:
		// refused, and the template keeps its recipe.
		_, err := e.CP.Sandboxes.UpdateTemplate(ctx, admin, tenantA, tpl.ID, sandboxes.TemplateIn{Image: "busybox", Runtime: rt}, nil)
		refusal(t, "an update decided on other secrets", err, "CONFLICT", sandboxes.ReasonSecretsChanged)
		if env := get(a); env["DB"] != refA {
			t.Fatalf("a refused update changed the template: %v", env)
		}
		if err := a.Call(ctx, "templates.update", upd, nil); err != nil {
			t.Fatalf("admin update: %v", err)
		}
		if err := templater.Call(ctx, "templates.update", upd, nil); err != nil {
			t.Fatalf("an update of a template naming no secret: %v", err)
		}

		// A new sandbox re-checks the template's secrets.
		if err := a.Call(ctx, "templates.create", secretTemplate(rt, "t2", map[string]string{"DB": refA}, 0), nil); err != nil {
			t.Fatal(err)
		}
		if err := a.Call(ctx, "secrets.delete", map[string]any{"ref": refA}, nil); err != nil {
			t.Fatal(err)
		}
		_, err = a.CreateSandbox(ctx, "", "t2")
		refusal(t, "a sandbox of a template whose secret was deleted", err, "INVALID_STATE", "template env DB: "+sandboxes.ReasonSecretUnknown)
	})
}

// TestWarmPoolSecretRotation: warm sandboxes hold no tenant environment,
// so a secret rotated while they wait reaches a claim at its new version
// (the claim's signed update carries the reference; the host resolves it
// then), and a deleted template's warm pool drains.
func TestWarmPoolSecretRotation(t *testing.T) {
	db := storetest.NewTestSQLite(t)
	s := startSandboxes(t, db, nil, 0)
	ctx := context.Background()
	ref := putTenantSecret(t, s.admin, "api", []byte("version-one-value"))
	var tpl sandboxes.Template
	if err := s.admin.Call(ctx, "templates.create", secretTemplate(s.rt, "pool", map[string]string{"API": ref}, 1), &tpl); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, s, tpl.ID, 1)
	warm := warmIDs(t, db, tpl.ID)
	if st, _ := s.Nodes[0].Sandbox.Get(warm[0]); !st.Warm || len(st.Env) != 0 {
		t.Fatalf("a warm sandbox holds the tenant's env: %+v", st)
	}
	putTenantSecret(t, s.admin, "api", []byte("version-two-value"))
	x, err := s.admin.CreateSandbox(ctx, "", "pool")
	if err != nil || !x.FromWarm {
		t.Fatalf("claim: %+v %v", x, err)
	}
	// The claim answered before its host applied it; an exec waits for
	// that (and prints nothing the database would keep).
	if _, err := s.admin.Exec(ctx, x.ID, []string{"true"}, 10); err != nil {
		t.Fatalf("exec after the claim: %v", err)
	}
	if env := hostEnv(t, s.Nodes[0], x.ID); !strings.Contains(env, "API=version-two-value\n") {
		t.Fatalf("the claimed sandbox does not hold the rotated value")
	}
	waitWarm(t, s, tpl.ID, 1)
	refill := warmIDs(t, db, tpl.ID)
	if _, _, err := s.admin.DeleteTemplate(ctx, tpl.ID); err != nil {
		t.Fatal(err)
	}
	for _, id := range refill {
		if st := sandboxState(t, db, id); st != "deleted" {
			t.Fatalf("warm sandbox %s of a deleted template is %s", id, st)
		}
	}
}
