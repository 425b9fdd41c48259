package approverkeys

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestKeyFiles: keys are written 0600 and read back; a private key file
// open to group or other is refused; public keys come from .pub or .key.
func TestKeyFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "approvers")
	pubs, err := Generate(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"approver-1.key", "approver-3.pub"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", name, st.Mode(), err)
		}
	}
	k, err := LoadPrivate(filepath.Join(dir, "approver-2.key"))
	if err != nil || !k.Public().(ed25519.PublicKey).Equal(pubs[1]) {
		t.Fatalf("load private: %v", err)
	}
	got, err := LoadPublic([]string{dir})
	if err != nil || !reflect.DeepEqual(got, pubs) {
		t.Fatalf("load public dir: %v", err)
	}
	got, err = LoadPublic([]string{filepath.Join(dir, "approver-3.key"), filepath.Join(dir, "approver-1.pub")})
	if err != nil || !reflect.DeepEqual(got[0], pubs[2]) || !reflect.DeepEqual(got[1], pubs[0]) {
		t.Fatalf("load public files: %v", err)
	}
	if _, err := Generate(dir, 1); err == nil || !strings.Contains(err.Error(), "already holds approver-1.key") {
		t.Fatalf("overwrite: %v", err)
	}
	if err := os.Chmod(filepath.Join(dir, "approver-1.key"), 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPrivate(filepath.Join(dir, "approver-1.key")); err == nil || !strings.Contains(err.Error(), "accessible to group or other") {
		t.Fatalf("0640 key: %v", err)
	}
	if _, err := ParsePublic("AAAA"); err == nil {
		t.Fatal("short public key accepted")
	}
}
