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
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// leakCheck fails t when any of the forms (raw, base64, hex) of a value
// is in b.
type leakCheck struct {
	t     *testing.T
	forms [][]byte
}

func newLeakCheck(t *testing.T, values ...string) leakCheck {
	c := leakCheck{t: t}
	for _, v := range values {
		c.forms = append(c.forms, []byte(v), []byte(base64.StdEncoding.EncodeToString([]byte(v))), []byte(hex.EncodeToString([]byte(v))))
	}
	return c
}

func (c leakCheck) bytes(where string, b []byte) {
	c.t.Helper()
	for _, f := range c.forms {
		if bytes.Contains(b, f) {
			c.t.Fatalf("a plain env value appears in %s", where)
		}
	}
}

// tree checks every regular file under root.
func (c leakCheck) tree(root string) {
	c.t.Helper()
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
		c.bytes(p, b)
		return nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
}

// envLen asks, through an API exec, whether variable name holds a value
// of length n in sandbox id (the value itself never enters a command).
func envLen(t *testing.T, c *client.Client, id, name string, n int) {
	t.Helper()
	res, err := c.Exec(context.Background(), id, []string{"sh", "-c", `test "${#` + name + `}" = ` + strconv.Itoa(n)}, 30)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%s in sandbox %s: %+v %v", name, id, res, err)
	}
}

// TestSandboxSealedEnv: a template's plain env value (random, long) is
// visible to env in a cold sandbox and in a claimed warm one, while the
// commands table (payload and signed body), the database file (SQLite),
// the node's data folder, the logs and every API answer about the
// sandboxes hold it in no form (raw, base64, hex), and no answer holds a
// sealed value; the commands carry it sealed. After bcd restarts (the
// sandboxes adopted, the values gone with the process), an API exec still
// sees the plain value and the secret reference's value: the exec names
// the env key and the reference, and the host fetches them for it.
func TestSandboxSealedEnv(t *testing.T) {
	storetest.ForEachFreshDialect(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		db, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		logs := &syncBuffer{}
		rt := sandboxRuntime(t)
		e := testenv.Start(t, db, testenv.Options{Nodes: 1, SandboxRuntime: rt, LogTo: logs})
		tenant, admin := tenantWithImage(t, e, "sealco")
		cold, warm := "cold-"+ids.Secret(32), "warm-"+ids.Secret(32)
		secret := "s3cr3t-" + ids.Secret(24)
		ref := putTenantSecret(t, admin, "db", []byte(secret))
		leaks := newLeakCheck(t, cold, warm, secret)
		if err := admin.Call(ctx, "templates.create", secretTemplate(rt, "cold", map[string]string{"PLAIN": cold, "DB": ref}, 0), nil); err != nil {
			t.Fatalf("templates.create: %v", err)
		}
		var pool sandboxes.Template
		if err := admin.Call(ctx, "templates.create", secretTemplate(rt, "pool", map[string]string{"PLAIN": warm}, 1), &pool); err != nil {
			t.Fatalf("templates.create: %v", err)
		}
		s := sandboxEnv{Env: e, rt: rt, tenant: tenant, admin: admin}
		waitWarm(t, s, pool.ID, 1)

		x, err := admin.CreateSandbox(ctx, "", "cold")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		y, err := admin.CreateSandbox(ctx, "", "pool")
		if err != nil || !y.FromWarm {
			t.Fatalf("claim: %+v %v", y, err)
		}
		envLen(t, admin, y.ID, "PLAIN", len(warm)) // waits for the claim's update
		if env := hostEnv(t, e.Nodes[0], x.ID); !strings.Contains(env, "PLAIN="+cold+"\n") || !strings.Contains(env, "DB="+secret+"\n") {
			t.Fatal("the cold sandbox does not see its plain value and secret")
		}
		if env := hostEnv(t, e.Nodes[0], y.ID); !strings.Contains(env, "PLAIN="+warm+"\n") || strings.Contains(env, spec.SealedEnvPrefix) {
			t.Fatal("the claimed sandbox does not see its plain value")
		}

		// An exec that works for the tenant (it names env refs) still
		// takes no reference in its argv: the one answer of any module
		// command.
		for _, r := range []string{ref, "secret://root/nothere"} {
			_, err := admin.Exec(ctx, x.ID, []string{"echo", r}, 5)
			refusal(t, "an exec naming "+r, err, "INVALID_INPUT", sandboxes.ReasonArgvSecretRef)
		}

		// The commands that carried the env hold it sealed.
		rows, err := db.QueryContext(ctx, `SELECT kind, payload, COALESCE(body, payload) FROM commands`)
		if err != nil {
			t.Fatal(err)
		}
		sealed := 0
		for rows.Next() {
			var kind string
			var payload, body []byte
			if err := rows.Scan(&kind, &payload, &body); err != nil {
				t.Fatal(err)
			}
			leaks.bytes("a "+kind+" command's payload", payload)
			leaks.bytes("a "+kind+" command's signed body", body)
			if bytes.Contains(payload, []byte(spec.SealedEnvPrefix+tenant+":")) {
				sealed++
			}
		}
		rows.Close()
		if sealed != 2 {
			t.Fatalf("%d commands carry sealed values, want 2 (the cold create, the claim)", sealed)
		}
		for _, id := range []string{x.ID, y.ID} {
			var got json.RawMessage
			if err := admin.Call(ctx, "sandboxes.get", map[string]any{"id": id}, &got); err != nil {
				t.Fatal(err)
			}
			leaks.bytes("sandboxes.get", got)
			if bytes.Contains(got, []byte(spec.SealedEnvPrefix)) {
				t.Fatal("sandboxes.get answers a sealed value")
			}
		}
		var list json.RawMessage
		if err := admin.Call(ctx, "sandboxes.list", map[string]any{}, &list); err != nil {
			t.Fatal(err)
		}
		leaks.bytes("sandboxes.list", list)
		leaks.tree(e.Nodes[0].Dir)

		if rt == spec.RuntimeRunc {
			n := e.Nodes[0]
			n.Stop()
			n2 := e.OpenNode(t, n.Dir, "")
			n2.Start(t)
			n2.WaitConnected(t)
			envLen(t, admin, x.ID, "PLAIN", len(cold))
			envLen(t, admin, x.ID, "DB", len(secret))
			envLen(t, admin, y.ID, "PLAIN", len(warm))
			leaks.tree(n2.Dir)
		} else {
			t.Log("RESTART NOT TESTED: needs runc (the adopted sandboxes)")
		}
		var keys int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE action = 'compute:secrets:release' AND resource LIKE $1`,
			spec.EnvKeyRefPrefix+"%").Scan(&keys); err != nil || keys < 2 {
			t.Fatalf("%d env key releases audited (%v), want at least 2", keys, err)
		}
		e.Close()
		if path, ok := strings.CutPrefix(dsn, "sqlite:"); ok {
			leaks.tree(filepath.Dir(path)) // the database file (and its WAL)
		}
		leaks.tree(e.Dir)
		leaks.bytes("the logs", logs.Bytes())
	})
}
