package approval

import (
	"bytes"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// useEverything writes every file the store keeps.
func useEverything(t *testing.T, f *fixture) {
	t.Helper()
	f.enroll(t)
	d := digestOf(moveOp, "{}")
	r, err := f.s.Ask(moveOp, d, "x")
	must(t, err)
	must(t, f.s.Approve(r.ID, f.fresh(t)))
	must(t, f.s.Spend(r.ID, moveOp, d))
	f.s.NoteRefusedWrite()
	f.grant(t, moveOp, 3, 3)
	_, err = f.s.UseStanding(moveOp)
	must(t, err)
	must(t, f.s.GiveRootGrant(f.clk.Now().Add(time.Hour), f.fresh(t)))
	must(t, f.s.Anchor())
}

func TestFilesAre0600InA0700Folder(t *testing.T) {
	f := newFixture(t)
	useEverything(t, f)
	fi, err := os.Stat(f.dir)
	must(t, err)
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("folder mode %v", fi.Mode())
	}
	names := map[string]bool{}
	must(t, filepath.WalkDir(f.dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == f.dir {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		names[e.Name()] = true
		if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want a 0600 file", e.Name(), fi.Mode())
		}
		return nil
	}))
	for _, n := range []string{lockFile, factorFile, approvalsFile, opsFile, rootFile, anchorFile} {
		if !names[n] {
			t.Errorf("%s not written (have %v)", n, names)
		}
	}
}

func TestFactorSecretNeverInPlaintext(t *testing.T) {
	f := newFixture(t)
	useEverything(t, f)
	raw, err := base32.StdEncoding.WithPadding(base32.NoPadding).DecodeString(f.totp)
	must(t, err)
	forms := [][]byte{
		[]byte(f.totp), []byte(strings.ToLower(f.totp)), raw,
		[]byte(hex.EncodeToString(raw)), []byte(base64.StdEncoding.EncodeToString(raw)),
	}
	entries, err := os.ReadDir(f.dir)
	must(t, err)
	for _, e := range entries {
		b := f.readFile(t, e.Name())
		for _, form := range forms {
			if bytes.Contains(b, form) {
				t.Errorf("%s holds the factor secret in plaintext", e.Name())
			}
		}
		for _, form := range [][]byte{testSecret, []byte(hex.EncodeToString(testSecret))} {
			if bytes.Contains(b, form) {
				t.Errorf("%s holds the bastion key", e.Name())
			}
		}
	}
}

func TestOpenStoreChecks(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	must(t, os.Mkdir(open, 0o755))
	must(t, os.Chmod(open, 0o755))
	clk := clock.NewFake(t0)
	for _, c := range []Config{
		{Dir: open, Secret: testSecret, BastionID: "b", Clock: clk},
		{Dir: "", Secret: testSecret, BastionID: "b", Clock: clk},
		{Dir: filepath.Join(dir, "a"), Secret: testSecret[:8], BastionID: "b", Clock: clk},
		{Dir: filepath.Join(dir, "b"), Secret: testSecret, BastionID: "", Clock: clk},
		{Dir: filepath.Join(dir, "c"), Secret: testSecret, BastionID: "b\x00c", Clock: clk},
		{Dir: filepath.Join(dir, "d"), Secret: testSecret, BastionID: "b"},
	} {
		if _, err := OpenStore(c); err == nil {
			t.Errorf("OpenStore(%+v) accepted", c)
		}
	}
}
