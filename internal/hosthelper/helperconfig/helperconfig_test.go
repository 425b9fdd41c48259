package helperconfig

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const (
	pinA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	pinB = "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
)

// TestParseDefaultsAndPins: an empty file is Default; pins decode,
// lower-cased.
func TestParseDefaultsAndPins(t *testing.T) {
	c, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Fatalf("empty file = %+v, want %+v", c, Default())
	}
	c, err = Parse([]byte("command_root_sha256 = ['" + pinA + "', '" + pinB + "']\njoin_key_pin = '" + pinA + "'\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CommandRootSHA256[1]; got != strings.ToLower(pinB) {
		t.Fatalf("pin = %s", got)
	}
	if len(c.CommandRoots()) != 2 || c.CommandRoots()[0][0] != 0xaa || len(c.JoinKey()) != 32 {
		t.Fatalf("decoded pins: %v %v", c.CommandRoots(), c.JoinKey())
	}
}

// TestParseRefusesBadValues asserts each refusal by its error.
func TestParseRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       error
	}{
		{"unknown key", "command_roots = []\n", ErrUnknownKey},
		{"misspelt pin key", "command_root_sha265 = ['" + pinA + "']\n", ErrUnknownKey},
		{"not toml", "socket = \n", ErrSyntax},
		{"wrong type", "exe_sha256 = 'x'\n", ErrSyntax},
		{"bad hex", "command_root_sha256 = ['" + strings.Repeat("zz", 32) + "']\n", ErrHex},
		{"short pin", "command_root_sha256 = ['abcd']\n", ErrLength},
		{"long exe pin", "exe_sha256 = ['" + pinA + "00']\n", ErrLength},
		{"join key length", "join_key_pin = 'abcd'\n", ErrLength},
		{"join key hex", "join_key_pin = '" + strings.Repeat("g", 64) + "'\n", ErrHex},
		{"duplicate pin", "command_root_sha256 = ['" + pinA + "', '" + strings.ToUpper(pinA) + "']\n", ErrValue},
		{"relative socket", "socket = 'helper.sock'\n", ErrValue},
		{"unclean state dir", "state_dir = '/var/lib/../tmp'\n", ErrValue},
		{"root node user", "node_user = 'root'\n", ErrValue},
		{"odd node user", "node_user = 'bcd;x'\n", ErrValue},
		{"runtime listed twice", "sandbox_runtime = 'runc,runc'\nimage_store = 'file:///x'\n", ErrValue},
		{"sim among runtimes", "sandbox_runtime = 'runc,sim'\nimage_store = 'file:///x'\n", ErrValue},
		{"runtime list without image store", "sandbox_runtime = 'runc,runsc'\n", ErrValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Parse(%q) = %v, want %v", tc.file, err, tc.want)
			}
		})
	}
}

// TestParseRuntimeList: the helper's sandbox_runtime takes runc and
// runsc together.
func TestParseRuntimeList(t *testing.T) {
	c, err := Parse([]byte("sandbox_runtime = 'runc,runsc'\nimage_store = 'file:///x'\n"))
	if err != nil || c.SandboxRuntime != "runc,runsc" {
		t.Fatalf("runc,runsc: %+v, %v", c.SandboxRuntime, err)
	}
}

// TestEncodeRoundTrips: what the installer writes reads back the same.
func TestEncodeRoundTrips(t *testing.T) {
	c := Default()
	c.CommandRootSHA256 = []string{pinA}
	c.ExeSHA256 = []string{strings.ToLower(pinB)}
	c.JoinKeyPin = pinA
	got, err := Parse(c.Encode())
	if err != nil {
		t.Fatalf("%v\n%s", err, c.Encode())
	}
	if !reflect.DeepEqual(got, c) {
		t.Fatalf("round trip = %+v, want %+v", got, c)
	}
}

// TestLoadRefusesWritableFile: a helper.toml group or other may write is
// refused, whatever it holds, since the node could have moved a pin.
func TestLoadRefusesWritableFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "helper.toml")
	if err := os.WriteFile(p, []byte("command_root_sha256 = ['"+pinA+"']\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err != nil {
		t.Fatalf("0640 file: %v", err)
	}
	for _, mode := range []os.FileMode{0o660, 0o646} {
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(p); !errors.Is(err, ErrUnsafeFile) {
			t.Fatalf("mode %04o: %v, want ErrUnsafeFile", mode, err)
		}
	}
}

// FuzzParse: any bytes either are refused or give a Config that
// validates and survives Encode and Parse unchanged.
func FuzzParse(f *testing.F) {
	f.Add([]byte("command_root_sha256 = ['" + pinA + "']\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed config does not validate: %v", err)
		}
		again, err := Parse(c.Encode())
		if err != nil {
			t.Fatalf("encoded config refused: %v\n%s", err, c.Encode())
		}
		if !reflect.DeepEqual(normal(again), normal(c)) {
			t.Fatalf("round trip = %+v, want %+v", again, c)
		}
	})
}

// normal makes nil and empty lists compare equal.
func normal(c Config) Config {
	if len(c.ExeSHA256) == 0 {
		c.ExeSHA256 = nil
	}
	if len(c.CommandRootSHA256) == 0 {
		c.CommandRootSHA256 = nil
	}
	return c
}
