package cli_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
)

// writeKEK writes kek to a new 0600 file in dir and returns its path.
func writeKEK(t *testing.T, dir, name string, kek pki.KEK) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(base64.StdEncoding.EncodeToString(kek[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRotateKEKRefusals: rotate-kek refuses, exit 2 and before anything
// changes, a missing flag, the same key twice (same file or a copy), a
// new key file readable by others and an old key that does not open the
// bundle (naming the slot); an item in the database under neither key
// stops it with exit 1 naming the row, before the bundle is touched. The
// new key is read from its file even when BC_KEK holds the old one.
func TestRotateKEKRefusals(t *testing.T) {
	t.Setenv(pki.KEKEnv, "")
	t.Setenv("BC_DB", "")
	dir := t.TempDir()
	pkiDir, oldFile := filepath.Join(dir, "pki"), filepath.Join(dir, "kek")
	if code, _, errOut := run(t, "pki", "init", "--dir", pkiDir, "--kek-file", oldFile); code != 0 {
		t.Fatalf("pki init: %d %s", code, errOut)
	}
	old, err := pki.LoadKEK(oldFile)
	if err != nil {
		t.Fatal(err)
	}
	dsn := "sqlite:" + filepath.Join(dir, "bc.db")
	bundle := func() []byte {
		b, err := os.ReadFile(filepath.Join(pkiDir, pki.BundleFile))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	before := bundle()
	third := writeKEK(t, dir, "third", pki.KEK{1, 2, 3})
	copyOfOld := writeKEK(t, dir, "copy", old)
	loose := writeKEK(t, dir, "loose", pki.KEK{9})
	if err := os.Chmod(loose, 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"pki", "rotate-kek", "--pki", pkiDir}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--db", dsn, "--kek-file", oldFile}, "--new-kek-file and --db"},
		{[]string{"--kek-file", oldFile, "--new-kek-file", filepath.Join(dir, "new")}, "--new-kek-file and --db"},
		{[]string{"--db", dsn, "--kek-file", oldFile, "--new-kek-file", oldFile}, "INVALID_INPUT: pki: the new key-encryption key is the old one"},
		{[]string{"--db", dsn, "--kek-file", oldFile, "--new-kek-file", copyOfOld}, "INVALID_INPUT: pki: the new key-encryption key is the old one"},
		{[]string{"--db", dsn, "--kek-file", oldFile, "--new-kek-file", loose}, "INVALID_CONFIG: --new-kek-file"},
		{[]string{"--db", dsn, "--kek-file", third, "--new-kek-file", filepath.Join(dir, "new")}, "bundle slot audit-key: sealed data opens under neither"},
	} {
		code, _, errOut := run(t, append(base, c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d: %s, want 2 and %q", c.args, code, errOut, c.want)
		}
	}
	if !bytes.Equal(bundle(), before) {
		t.Fatal("a refused rotation changed the bundle")
	}

	// A secret value under neither key: exit 1 naming it; the bundle is
	// still under the old key.
	db, err := store.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(context.Background(), `INSERT INTO secrets (ref, version, tenant_id, name, scope, sealed, created_by, created_at)
		VALUES ($1, 1, $2, 'broken', 'tenant', $3, 'test', 0)`, "secret://"+iam.RootTenant+"/broken", iam.RootTenant, []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	newFile := filepath.Join(dir, "new")
	args := append(base, "--db", dsn, "--kek-file", oldFile, "--new-kek-file", newFile)
	code, _, errOut := run(t, args...)
	if code != 1 || !strings.Contains(errOut, "table secrets, secret://"+iam.RootTenant+"/broken version 1: sealed data opens under neither") {
		t.Fatalf("a broken secret: exit %d: %s", code, errOut)
	}
	if !bytes.Equal(bundle(), before) {
		t.Fatal("the bundle changed although the database part failed")
	}
	if _, err := db.ExecContext(context.Background(), `DELETE FROM secrets`); err != nil {
		t.Fatal(err)
	}
	// A bastion key sealed under the old key is re-sealed with the rest.
	if _, err := bastions.New(db, clock.Real{}, old, nil, nil, nil).GrantVerifyKey(context.Background()); err != nil {
		t.Fatal(err)
	}

	// With BC_KEK holding the old key, the new key still comes from its
	// file (made by the failed run above), and the rotation goes through.
	t.Setenv(pki.KEKEnv, base64.StdEncoding.EncodeToString(old[:]))
	code, out, errOut := run(t, append(base, "--db", dsn, "--kek-file", filepath.Join(dir, "absent"), "--new-kek-file", newFile)...)
	if code != 0 || !strings.Contains(out, "bundle slots: 6 re-sealed, 0 already done") || !strings.Contains(out, "bastion keys: 1 re-sealed, 0 already done") || !strings.Contains(out, "next: ") {
		t.Fatalf("rotation: exit %d: %s%s", code, out, errOut)
	}
	next, err := pki.LoadKEKFile(newFile)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pki.Load(pkiDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.NodeCAKey(next); err != nil {
		t.Fatalf("the bundle does not open under the new key: %v", err)
	}
	if fi, err := os.Stat(newFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the new key file: %v %v", fi, err)
	}
}
