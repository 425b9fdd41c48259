package pki

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testKEK(b byte) KEK {
	var k KEK
	for i := range k {
		k[i] = b + byte(i)
	}
	return k
}

func TestSealOpenRoundTrip(t *testing.T) {
	kek := testKEK(1)
	for _, pt := range [][]byte{nil, {}, []byte("x"), bytes.Repeat([]byte("secret"), 1000)} {
		sealed, err := Seal(kek, pt, []byte("aad"))
		if err != nil {
			t.Fatal(err)
		}
		if sealed[0] != 1 || len(sealed) != 1+12+len(pt)+16 {
			t.Fatalf("bad layout: version %d len %d", sealed[0], len(sealed))
		}
		got, err := Open(kek, sealed, []byte("aad"))
		if err != nil || !bytes.Equal(got, pt) {
			t.Fatalf("Open = %q, %v", got, err)
		}
	}
}

func TestSealNoncesDiffer(t *testing.T) {
	a, _ := Seal(testKEK(1), []byte("p"), nil)
	b, _ := Seal(testKEK(1), []byte("p"), nil)
	if bytes.Equal(a, b) {
		t.Fatal("two seals of the same plaintext are identical")
	}
}

func TestOpenRefusesTampering(t *testing.T) {
	kek := testKEK(1)
	sealed, err := Seal(kek, []byte("private key bytes"), []byte("bc-pki/node-ca"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range sealed {
		for _, bit := range []byte{0x01, 0x80} {
			bad := bytes.Clone(sealed)
			bad[i] ^= bit
			if _, err := Open(kek, bad, []byte("bc-pki/node-ca")); !errors.Is(err, ErrSealBroken) {
				t.Fatalf("byte %d bit %#x: err = %v, want ErrSealBroken", i, bit, err)
			}
		}
	}
	tests := []struct {
		name   string
		kek    KEK
		sealed []byte
		aad    []byte
	}{
		{"wrong aad", kek, sealed, []byte("bc-pki/internal-ca")},
		{"missing aad", kek, sealed, nil},
		{"wrong kek", testKEK(2), sealed, []byte("bc-pki/node-ca")},
		{"truncated", kek, sealed[:len(sealed)-1], []byte("bc-pki/node-ca")},
		{"too short", kek, sealed[:20], []byte("bc-pki/node-ca")},
		{"empty", kek, nil, []byte("bc-pki/node-ca")},
		{"extended", kek, append(bytes.Clone(sealed), 0), []byte("bc-pki/node-ca")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Open(tt.kek, tt.sealed, tt.aad)
			if !errors.Is(err, ErrSealBroken) {
				t.Fatalf("err = %v, want ErrSealBroken", err)
			}
			if err.Error() != "pki: open: pki: sealed data does not open" {
				t.Fatalf("err text = %q", err)
			}
		})
	}
}

func TestSealRefusesZeroKEK(t *testing.T) {
	_, err := Seal(KEK{}, []byte("p"), nil)
	if err == nil || err.Error() != "pki: refusing to seal under an all-zero KEK" {
		t.Fatalf("err = %v", err)
	}
}

func writeKEKFile(t *testing.T, dir string, kek KEK, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, "kek")
	if err := os.WriteFile(p, []byte(base64.StdEncoding.EncodeToString(kek[:])+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // umask-proof
		t.Fatal(err)
	}
	return p
}

func TestLoadKEK(t *testing.T) {
	fileKEK, envKEK := testKEK(10), testKEK(20)
	envB64 := base64.StdEncoding.EncodeToString(envKEK[:])
	tests := []struct {
		name    string
		env     string
		mode    os.FileMode // 0 = no file
		content string      // overrides the file content when set
		want    KEK
		wantErr string // substring-free: exact text, %s = path
		wantIs  error
	}{
		{name: "file 0600", mode: 0o600, want: fileKEK},
		{name: "file 0400", mode: 0o400, want: fileKEK},
		{name: "env wins over file", env: envB64, mode: 0o600, want: envKEK},
		{name: "env wins over bad file", env: envB64, mode: 0o644, want: envKEK},
		{name: "env used without file", env: envB64, want: envKEK},
		{name: "env not base64", env: "!!!", mode: 0o600, wantErr: "pki: BC_KEK: not base64 of 32 bytes"},
		{name: "env short", env: base64.StdEncoding.EncodeToString(make([]byte, 31)), wantErr: "pki: BC_KEK: not base64 of 32 bytes"},
		{name: "env zero key", env: base64.StdEncoding.EncodeToString(make([]byte, 32)), wantErr: "pki: BC_KEK: all-zero key"},
		{name: "file 0644 refused", mode: 0o644, wantErr: "pki: KEK file %s has mode 0644; it must not be accessible by group or other (chmod 600)"},
		{name: "file 0660 refused", mode: 0o660, wantErr: "pki: KEK file %s has mode 0660; it must not be accessible by group or other (chmod 600)"},
		{name: "file 0601 refused", mode: 0o601, wantErr: "pki: KEK file %s has mode 0601; it must not be accessible by group or other (chmod 600)"},
		{name: "missing file", wantIs: fs.ErrNotExist},
		{name: "file garbage", mode: 0o600, content: "not a key", wantErr: "pki: KEK file %s: not base64 of 32 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(KEKEnv, tt.env)
			dir := t.TempDir()
			path := filepath.Join(dir, "kek")
			if tt.mode != 0 {
				path = writeKEKFile(t, dir, fileKEK, tt.mode)
				if tt.content != "" {
					if err := os.WriteFile(path, []byte(tt.content), tt.mode); err != nil {
						t.Fatal(err)
					}
				}
			}
			got, err := LoadKEK(path)
			switch {
			case tt.wantIs != nil:
				if !errors.Is(err, tt.wantIs) {
					t.Fatalf("err = %v, want %v", err, tt.wantIs)
				}
			case tt.wantErr != "":
				want := strings.Replace(tt.wantErr, "%s", path, 1)
				if err == nil || err.Error() != want {
					t.Fatalf("err = %v, want %q", err, want)
				}
				if strings.Contains(err.Error(), base64.StdEncoding.EncodeToString(fileKEK[:])) {
					t.Fatal("error leaks key content")
				}
			default:
				if err != nil || got != tt.want {
					t.Fatalf("LoadKEK = %x, %v; want %x", got, err, tt.want)
				}
			}
		})
	}
}

// TestLoadKEKRefusesEveryGroupOrOtherBit: each single permission bit of
// group or other (read, write or execute) on top of 0600 is refused, so a
// file writable but not readable by others is refused too.
func TestLoadKEKRefusesEveryGroupOrOtherBit(t *testing.T) {
	t.Setenv(KEKEnv, "")
	for bit := os.FileMode(1); bit <= 0o040; bit <<= 1 {
		mode := 0o600 | bit
		t.Run(fmt.Sprintf("%04o", mode), func(t *testing.T) {
			path := writeKEKFile(t, t.TempDir(), testKEK(10), mode)
			want := fmt.Sprintf("pki: KEK file %s has mode %04o; it must not be accessible by group or other (chmod 600)", path, mode)
			if _, err := LoadKEK(path); err == nil || err.Error() != want {
				t.Fatalf("err = %v, want %q", err, want)
			}
		})
	}
}

func TestCreateKEK(t *testing.T) {
	t.Setenv(KEKEnv, "")
	path := filepath.Join(t.TempDir(), "kek")
	k, err := CreateKEK(path)
	if err != nil {
		t.Fatal(err)
	}
	if k == (KEK{}) {
		t.Fatal("zero KEK")
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, %v", fi.Mode(), err)
	}
	got, err := LoadKEK(path)
	if err != nil || got != k {
		t.Fatalf("LoadKEK after CreateKEK = %v", err)
	}
	if _, err := CreateKEK(path); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second CreateKEK err = %v, want ErrExist", err)
	}
	if again, _ := LoadKEK(path); again != k {
		t.Fatal("existing KEK was overwritten")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("stray temp files: %v", entries)
	}
}

func TestWriteFileAtomic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	for _, content := range []string{"one", "two"} {
		if err := WriteFileAtomic(path, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("content = %q, %v", got, err)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o640 {
			t.Fatalf("mode = %v", fi.Mode())
		}
	}
	if err := WriteFileAtomic(filepath.Join(t.TempDir(), "missing", "f"), nil, 0o600); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v", err)
	}
}
