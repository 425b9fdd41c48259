package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// bootstrapPKI makes a KEK and a PKI bundle in dir and returns their paths.
func bootstrapPKI(t *testing.T, dir string) (kekFile, pkiDir string) {
	t.Helper()
	kekFile, pkiDir = filepath.Join(dir, "kek"), filepath.Join(dir, "pki")
	kek, err := pki.CreateKEK(kekFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Init(pkiDir, "boot.bc.local", kek, clock.Real{}); err != nil {
		t.Fatal(err)
	}
	return kekFile, pkiDir
}

// bootstrap migrates a fresh database and mints the root admin key into a
// new 0600 file: the key authenticates as the admin identity of the root
// tenant, and its audit row is the first row of the root tenant's log. An
// existing --out file is refused before any key is made; once the admin
// key exists a second bootstrap is refused (exit 1) and adds no key, no
// file and no audit row.
func TestBootstrapMintsTheFirstAdminKeyOnce(t *testing.T) {
	storetest.ForEachFreshDialect(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		dir := t.TempDir()
		kekFile, pkiDir := bootstrapPKI(t, dir)
		out := filepath.Join(dir, "admin.key")
		args := []string{"bootstrap", "--db", dsn, "--kek-file", kekFile, "--pki", pkiDir}

		// An existing --out is refused before the key is made.
		if err := os.WriteFile(out, []byte("keep me\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if code, _, errs := run(t, append(args, "--out", out)...); code != 1 || !strings.Contains(errs, "--force") {
			t.Fatalf("existing --out: exit %d: %s", code, errs)
		}
		if b, _ := os.ReadFile(out); string(b) != "keep me\n" {
			t.Fatalf("the existing file was overwritten: %q", b)
		}
		os.Remove(out)

		code, stdout, errs := run(t, append(args, "--out", out, "--name", "first admin")...)
		if code != 0 || !strings.Contains(stdout, "written to "+out+" (0600)") {
			t.Fatalf("bootstrap: exit %d: %s %s", code, stdout, errs)
		}
		st, err := os.Stat(out)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("key file: %v %v", st, err)
		}
		keyText, _ := os.ReadFile(out)
		key := strings.TrimSpace(string(keyText))

		again := filepath.Join(dir, "again.key")
		code, _, errs = run(t, append(args, "--out", again)...)
		if code != 1 || !strings.Contains(errs, "already has an admin key") || !strings.Contains(errs, "api-keys create") {
			t.Fatalf("second bootstrap: exit %d: %s", code, errs)
		}
		if _, err := os.Lstat(again); !os.IsNotExist(err) {
			t.Fatalf("the refused bootstrap left %s: %v", again, err)
		}

		db, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		ids := iam.New(db, clock.Real{})
		p, err := apikeys.New(db, clock.Real{}, ids).Authenticate(ctx, key)
		if err != nil || p.Identity != "admin" || p.HomeTenant != iam.RootTenant || !p.ExpiresAt.IsZero() {
			t.Fatalf("the key authenticates as %+v (%v), want admin of the root tenant without expiry", p, err)
		}
		keys, err := apikeys.New(db, clock.Real{}, ids).List(ctx, iam.RootTenant)
		if err != nil || len(keys) != 1 || keys[0].ID != p.KeyID || keys[0].Name != "first admin" {
			t.Fatalf("root keys: %+v %v", keys, err)
		}
		l, err := auditlog.New(auditlog.Config{DB: db, Clock: clock.Real{}})
		if err != nil {
			t.Fatal(err)
		}
		evs, err := l.List(ctx, iam.RootTenant, 0, 0)
		if err != nil || len(evs) != 1 {
			t.Fatalf("root log: %d rows (%v), want only the bootstrap row", len(evs), err)
		}
		if e := evs[0]; e.Actor != "bootstrap" || e.Action != "compute:api-keys:create" || e.Resource != "api-key/"+p.KeyID || e.Outcome != "allowed" {
			t.Fatalf("first row of the root log: %+v", e)
		}
	})
}

// bootstrap refuses a key-encryption key that does not unseal the bundle
// (exit 2) and touches neither the database nor the --out file.
func TestBootstrapRefusesAWrongKEK(t *testing.T) {
	dir := t.TempDir()
	_, pkiDir := bootstrapPKI(t, dir)
	other := filepath.Join(dir, "other.kek")
	if _, err := pki.CreateKEK(other); err != nil {
		t.Fatal(err)
	}
	dbPath := filepath.Join(dir, "control.db")
	out := filepath.Join(dir, "admin.key")
	code, _, errs := run(t, "bootstrap", "--db", "sqlite:"+dbPath, "--kek-file", other, "--pki", pkiDir, "--out", out)
	if code != 2 || !strings.Contains(errs, "does not unseal") {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, p := range []string{dbPath, out} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Fatalf("%s exists after the refusal: %v", p, err)
		}
	}
}
