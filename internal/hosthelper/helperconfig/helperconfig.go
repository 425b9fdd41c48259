// Package helperconfig is the root helper's configuration file,
// /etc/bcd/helper.toml: where the helper's socket is, which account the
// node agent runs as, and the pins the helper trusts on its own (installed
// bcd binaries, command-signing roots, the join key). The file is root's:
// the node never writes it, so nothing the node sends can move a pin. It
// is decoded strictly (an unknown key is refused, so a misspelt pin is an
// error and not a silently missing pin) and every value is validated
// before the helper uses it.
package helperconfig

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	toml "github.com/pelletier/go-toml/v2"

	"github.com/bettercompute/bettercompute/internal/ids"
)

// Path is where the helper and the installer read and write the file.
const Path = "/etc/bcd/helper.toml"

// MaxSize bounds the file: a few pins and paths, never large.
const MaxSize = 64 << 10

// Defaults, used for a key the file leaves out.
const (
	DefaultSocket   = "/run/bcd-helper/helper.sock"
	DefaultNodeUser = "bcd"
	DefaultStateDir = "/var/lib/bcd-helper"
	DefaultSSHDDir  = "/etc/ssh/bcd"
)

// Errors a caller can match with errors.Is.
var (
	// ErrSyntax: not valid TOML, or a value of the wrong type.
	ErrSyntax = errors.New("not valid TOML")
	// ErrUnknownKey: a key the file format does not have.
	ErrUnknownKey = errors.New("unknown key")
	// ErrHex: a pin that is not hexadecimal.
	ErrHex = errors.New("not hexadecimal")
	// ErrLength: a pin of the wrong length.
	ErrLength = errors.New("wrong length")
	// ErrValue: a path that is not absolute and clean, an account name
	// that is not a plain system account name, or a duplicate pin.
	ErrValue = errors.New("invalid value")
	// ErrUnsafeFile: the file is writable by group or other, not owned
	// by root (or the process's own user), not a regular file, or too big.
	ErrUnsafeFile = errors.New("unsafe config file")
)

// Config is the decoded file. The pins are kept as lower-case hex, as
// written; Validate checks them and the accessors decode them.
type Config struct {
	// Socket is the helper's Unix socket; its directory must be root's.
	Socket string `toml:"socket"`
	// NodeUser is the account bcd node runs as; only it (and root) may
	// call the helper.
	NodeUser string `toml:"node_user"`
	// ExeSHA256 pins installed bcd binaries (SHA-256, hex): a caller's
	// executable must be one of them or the helper's own.
	ExeSHA256 []string `toml:"exe_sha256"`
	// CommandRootSHA256 pins the command-signing root certificates
	// (SHA-256 of each DER, hex), given at install, never taken from the
	// control plane or the node.
	CommandRootSHA256 []string `toml:"command_root_sha256"`
	// JoinKeyPin is the optional Ed25519 join-signing public key (hex)
	// that a trust bundle must verify under.
	JoinKeyPin string `toml:"join_key_pin"`
	// NodeID, when set, is the node this helper serves (the id `bcd join`
	// printed): a desired state naming another node is refused. Unset,
	// the helper takes the node id of the first desired state that
	// verifies and keeps it (trust on first use).
	NodeID string `toml:"node_id"`
	// StateDir is the helper's own state (0700 root).
	StateDir string `toml:"state_dir"`
	// SSHDDir is where the helper writes sshd's bcd files.
	SSHDDir string `toml:"sshd_dir"`
	// Driver is the host's driver (linux, default, or sim), whose
	// inventory gpu.reset would check a GPU against; the helper serves no
	// gpu.reset yet.
	Driver string `toml:"driver"`
	// SandboxRuntime is the runtime of the sandboxes the helper runs for
	// the node: none (default: the helper runs no sandbox), auto, runc,
	// runsc, or "runc,runsc" (both side by side, each sandbox on the one
	// its template names; each must work or the helper fails). The helper's sandbox host lives in StateDir/sandbox, never in
	// the node's data directory.
	SandboxRuntime string `toml:"sandbox_runtime"`
	// ImageStore is the gocloud.dev/blob URL of the sandbox image store
	// (root's to configure: the node never names it).
	ImageStore string `toml:"image_store"`
	// SandboxSlots and SandboxMemoryMB bound the sandboxes at once.
	SandboxSlots    int   `toml:"sandbox_slots"`
	SandboxMemoryMB int64 `toml:"sandbox_memory_mb"`
	// SandboxEgress is auto or off (default): network egress for
	// sandboxes through the egress proxy, which then runs in the helper.
	SandboxEgress string `toml:"sandbox_egress"`
}

// Default returns the configuration of an empty file: default paths and
// account, no pins.
func Default() Config {
	return Config{
		Socket:   DefaultSocket,
		NodeUser: DefaultNodeUser,
		StateDir: DefaultStateDir,
		SSHDDir:  DefaultSSHDDir,
		Driver:   "linux",
		// The helper runs no sandbox unless root names a runtime.
		SandboxRuntime:  "none",
		SandboxSlots:    16,
		SandboxMemoryMB: 8192,
		SandboxEgress:   "off",
	}
}

// Load reads and validates the file at path. It refuses a file that the
// node could have changed: one writable by group or other, or owned by
// neither root nor the calling user (so a test can load its own file),
// checked on the opened file.
func Load(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("helper config: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Config{}, fmt.Errorf("helper config: %w", err)
	}
	if err := safeFile(st); err != nil {
		return Config{}, fmt.Errorf("helper config %s: %w", path, err)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return Config{}, fmt.Errorf("helper config: %w", err)
	}
	if len(b) > MaxSize {
		return Config{}, fmt.Errorf("helper config %s: over %d bytes: %w", path, MaxSize, ErrUnsafeFile)
	}
	c, err := Parse(b)
	if err != nil {
		return Config{}, fmt.Errorf("helper config %s: %w", path, err)
	}
	return c, nil
}

// safeFile refuses a file that is not regular, is writable by group or
// other, or is owned by someone other than root or the caller.
func safeFile(st os.FileInfo) error {
	if !st.Mode().IsRegular() {
		return fmt.Errorf("not a regular file: %w", ErrUnsafeFile)
	}
	if perm := st.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("writable by group or other (mode %04o): %w", perm, ErrUnsafeFile)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("no owner: %w", ErrUnsafeFile)
	}
	if sys.Uid != 0 && int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("owned by uid %d, not root: %w", sys.Uid, ErrUnsafeFile)
	}
	return nil
}

// Parse decodes b strictly over Default and validates the result.
func Parse(b []byte) (Config, error) {
	c := Default()
	dec := toml.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		var strict *toml.StrictMissingError
		if errors.As(err, &strict) {
			return Config{}, fmt.Errorf("%w:\n%s", ErrUnknownKey, strict.String())
		}
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return Config{}, fmt.Errorf("line %d, column %d: %s: %w", row, col, de.Error(), ErrSyntax)
		}
		return Config{}, fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	c.normalise()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// normalise lower-cases the pins, so a pin compares equal however it was
// typed.
func (c *Config) normalise() {
	for i := range c.ExeSHA256 {
		c.ExeSHA256[i] = strings.ToLower(c.ExeSHA256[i])
	}
	for i := range c.CommandRootSHA256 {
		c.CommandRootSHA256[i] = strings.ToLower(c.CommandRootSHA256[i])
	}
	c.JoinKeyPin = strings.ToLower(c.JoinKeyPin)
}

// Validate checks every value: absolute clean paths, a plain account name
// that is not root, and pins of the right length in hexadecimal.
func (c Config) Validate() error {
	for _, p := range []struct{ key, val string }{
		{"socket", c.Socket}, {"state_dir", c.StateDir}, {"sshd_dir", c.SSHDDir},
	} {
		if !filepath.IsAbs(p.val) || filepath.Clean(p.val) != p.val || p.val == "/" {
			return fmt.Errorf("%s %q: not an absolute clean path below /: %w", p.key, p.val, ErrValue)
		}
	}
	if c.NodeID != "" && !ids.Valid("n", c.NodeID) {
		return fmt.Errorf("node_id %q: not a node id: %w", c.NodeID, ErrValue)
	}
	if err := c.validateSandbox(); err != nil {
		return err
	}
	if !validUser(c.NodeUser) {
		return fmt.Errorf("node_user %q: not a system account name other than root: %w", c.NodeUser, ErrValue)
	}
	if err := checkPins("exe_sha256", c.ExeSHA256, sha256.Size); err != nil {
		return err
	}
	if err := checkPins("command_root_sha256", c.CommandRootSHA256, sha256.Size); err != nil {
		return err
	}
	if c.JoinKeyPin != "" {
		if err := checkPin("join_key_pin", c.JoinKeyPin, ed25519.PublicKeySize); err != nil {
			return err
		}
	}
	return nil
}

// validateSandbox checks the driver and sandbox settings.
func (c Config) validateSandbox() error {
	oneOf := func(key, v string, ok ...string) error {
		for _, o := range ok {
			if v == o {
				return nil
			}
		}
		return fmt.Errorf("%s %q: want one of %s: %w", key, v, strings.Join(ok, ", "), ErrValue)
	}
	if err := errors.Join(oneOf("driver", c.Driver, "linux", "sim"),
		oneOf("sandbox_runtime", c.SandboxRuntime, "none", "auto", "runc", "runsc", "runc,runsc", "runsc,runc"),
		oneOf("sandbox_egress", c.SandboxEgress, "auto", "off")); err != nil {
		return err
	}
	if c.SandboxSlots < 1 || c.SandboxSlots > 4096 || c.SandboxMemoryMB < 1 {
		return fmt.Errorf("sandbox_slots %d / sandbox_memory_mb %d: out of range: %w", c.SandboxSlots, c.SandboxMemoryMB, ErrValue)
	}
	if c.SandboxRuntime != "none" && c.ImageStore == "" {
		return fmt.Errorf("sandbox_runtime %q needs image_store: %w", c.SandboxRuntime, ErrValue)
	}
	return nil
}

// validUser accepts a lower-case account name of at most 32 bytes that
// starts with a letter or '_', as useradd's default rule, and is not root.
func validUser(u string) bool {
	if u == "" || len(u) > 32 || u == "root" { // archtest:not-tenant (an account name)
		return false
	}
	for i, r := range u {
		switch {
		case r >= 'a' && r <= 'z', r == '_':
		case i > 0 && (r >= '0' && r <= '9' || r == '-'):
		default:
			return false
		}
	}
	return true
}

// checkPins checks each pin of a list and refuses a duplicate.
func checkPins(key string, pins []string, size int) error {
	seen := make(map[string]bool, len(pins))
	for i, p := range pins {
		if err := checkPin(fmt.Sprintf("%s[%d]", key, i), p, size); err != nil {
			return err
		}
		if seen[p] {
			return fmt.Errorf("%s[%d]: duplicate pin: %w", key, i, ErrValue)
		}
		seen[p] = true
	}
	return nil
}

// checkPin checks one hex pin of size bytes. The pin is not echoed whole:
// its length says enough.
func checkPin(key, p string, size int) error {
	b, err := hex.DecodeString(p)
	if err != nil {
		return fmt.Errorf("%s: %w", key, ErrHex)
	}
	if len(b) != size {
		return fmt.Errorf("%s: %d bytes, want %d: %w", key, len(b), size, ErrLength)
	}
	return nil
}

// CommandRoots returns the pinned command-signing root digests.
func (c Config) CommandRoots() [][sha256.Size]byte { return digests(c.CommandRootSHA256) }

// Executables returns the pinned bcd binary digests.
func (c Config) Executables() [][sha256.Size]byte { return digests(c.ExeSHA256) }

// JoinKey returns the pinned join-signing key, or nil when none is pinned.
func (c Config) JoinKey() ed25519.PublicKey {
	if c.JoinKeyPin == "" {
		return nil
	}
	b, _ := hex.DecodeString(c.JoinKeyPin) // checked by Validate
	return ed25519.PublicKey(b)
}

// digests decodes validated hex pins.
func digests(pins []string) [][sha256.Size]byte {
	out := make([][sha256.Size]byte, 0, len(pins))
	for _, p := range pins {
		var d [sha256.Size]byte
		if n, err := hex.Decode(d[:], []byte(p)); err == nil && n == sha256.Size {
			out = append(out, d)
		}
	}
	return out
}

// Encode renders c as the file the installer writes: every key, with a
// comment saying what it is, in a fixed order, so the same Config always
// gives the same bytes (the installer's idempotence rests on it).
func (c Config) Encode() []byte {
	var b strings.Builder
	b.WriteString("# bcd helper configuration (root's; the node never writes it).\n")
	b.WriteString("# Written by bcd install --unprivileged; decoded strictly.\n\n")
	b.WriteString("# The helper's socket; its directory is root's.\n")
	fmt.Fprintf(&b, "socket = %s\n", quote(c.Socket))
	b.WriteString("# The account bcd node runs as.\n")
	fmt.Fprintf(&b, "node_user = %s\n", quote(c.NodeUser))
	b.WriteString("# SHA-256 of each installed bcd binary a caller may run.\n")
	fmt.Fprintf(&b, "exe_sha256 = %s\n", list(c.ExeSHA256))
	b.WriteString("# SHA-256 of each command-signing root certificate (DER).\n")
	fmt.Fprintf(&b, "command_root_sha256 = %s\n", list(c.CommandRootSHA256))
	if c.JoinKeyPin != "" {
		b.WriteString("# The join-signing Ed25519 public key.\n")
		fmt.Fprintf(&b, "join_key_pin = %s\n", quote(c.JoinKeyPin))
	}
	if c.NodeID != "" {
		b.WriteString("# The node this helper serves (bcd join printed it).\n")
		fmt.Fprintf(&b, "node_id = %s\n", quote(c.NodeID))
	}
	fmt.Fprintf(&b, "state_dir = %s\n", quote(c.StateDir))
	fmt.Fprintf(&b, "sshd_dir = %s\n", quote(c.SSHDDir))
	b.WriteString("# The host driver (linux or sim) and the sandboxes the helper runs.\n")
	fmt.Fprintf(&b, "driver = %s\n", quote(c.Driver))
	fmt.Fprintf(&b, "sandbox_runtime = %s\n", quote(c.SandboxRuntime))
	if c.ImageStore != "" {
		fmt.Fprintf(&b, "image_store = %s\n", quote(c.ImageStore))
	}
	fmt.Fprintf(&b, "sandbox_slots = %d\n", c.SandboxSlots)
	fmt.Fprintf(&b, "sandbox_memory_mb = %d\n", c.SandboxMemoryMB)
	fmt.Fprintf(&b, "sandbox_egress = %s\n", quote(c.SandboxEgress))
	return []byte(b.String())
}

// quote renders s as a TOML literal string when it can, else a basic one.
func quote(s string) string {
	if !strings.ContainsAny(s, "'\n\r") {
		return "'" + s + "'"
	}
	b, _ := toml.Marshal(map[string]string{"v": s})
	_, v, _ := strings.Cut(strings.TrimSpace(string(b)), " = ")
	return v
}

// list renders a list of strings.
func list(v []string) string {
	q := make([]string, len(v))
	for i, s := range v {
		q[i] = quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
