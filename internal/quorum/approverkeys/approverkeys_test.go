package approverkeys

import (
	"crypto/ed25519"
	"fmt"
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
	for i := 1; i <= 3; i++ {
		for _, ext := range []string{".key", ".pub"} {
			name := fmt.Sprintf("approver-%d%s", i, ext)
			st, err := os.Stat(filepath.Join(dir, name))
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("%s: mode %v (%v), want 0600", name, st.Mode(), err)
			}
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
	// Every single group or other bit (read, write or execute) on top of
	// 0600 is refused, with the exact message.
	keyPath := filepath.Join(dir, "approver-1.key")
	for bit := os.FileMode(1); bit <= 0o040; bit <<= 1 {
		mode := 0o600 | bit
		if err := os.Chmod(keyPath, mode); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("approverkeys: approver key %s is accessible to group or other (mode %04o); chmod 600 it", keyPath, mode)
		if _, err := LoadPrivate(keyPath); err == nil || err.Error() != want {
			t.Fatalf("mode %04o: err = %v, want %q", mode, err, want)
		}
	}
	if err := os.Chmod(keyPath, 0o400); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPrivate(keyPath); err != nil {
		t.Fatalf("0400 key refused: %v", err)
	}
	if _, err := ParsePublic("AAAA"); err == nil {
		t.Fatal("short public key accepted")
	}
}
