package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
	"github.com/bettercompute/bettercompute/internal/bastion/wgtun"
)

// Files in the bastion's data folder (besides the join record and
// identity the node join writes).
const (
	wgKeyFile    = "wg.key"         // the WireGuard private key, 0600
	grantPinFile = "grant-key.pin"  // the grant verifier key pinned on first use, 0600
	auditFile    = "audit.log"      // the on-machine audit chain, 0600
	unpairedFile = "UNPAIRED"       // left after an unpair, so a restart does not try again
	pairedFile   = "bastion.paired" // marks a data folder paired as a bastion
)

// keyFiles are the files an unpair deletes: every key and the identity.
var keyFiles = []string{wgKeyFile, grantPinFile, "identity.json"}

// makeWGKey makes the bastion's WireGuard key on this machine, once.
func makeWGKey(dir string) error {
	k, err := wgtun.GenerateKey()
	if err != nil {
		return fmt.Errorf("bastion: wireguard key: %w", err)
	}
	return atomicfile.Write(filepath.Join(dir, wgKeyFile), []byte(k.String()+"\n"), 0o600)
}

// readWGKey reads the WireGuard private key.
func readWGKey(dir string) (wgtun.Key, error) {
	b, err := os.ReadFile(filepath.Join(dir, wgKeyFile))
	if err != nil {
		return wgtun.Key{}, fmt.Errorf("bastion: wireguard key: %w", err)
	}
	return wgtun.ParseKey(strings.TrimSpace(string(b)))
}

// pinGrantKey pins vkey on first use and refuses a different one later.
func pinGrantKey(dir, vkey string) error {
	p := filepath.Join(dir, grantPinFile)
	b, err := os.ReadFile(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return atomicfile.Write(p, []byte(vkey+"\n"), 0o600)
	case err != nil:
		return fmt.Errorf("bastion: grant key pin: %w", err)
	case strings.TrimSpace(string(b)) != vkey:
		return errGrantKeyChanged
	}
	return nil
}

// pinnedGrantKey returns the pinned grant verifier key ("" before the
// first configuration).
func pinnedGrantKey(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, grantPinFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("bastion: grant key pin: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// forgetKeys deletes the bastion's keys and identity after an unpair and
// marks the folder unpaired. The audit chain stays: it is the owner's
// record.
func forgetKeys(dir string) error {
	var errsOut []error
	for _, f := range keyFiles {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errsOut = append(errsOut, err)
		}
	}
	if err := atomicfile.Write(filepath.Join(dir, unpairedFile), []byte("unpaired\n"), 0o600); err != nil {
		errsOut = append(errsOut, err)
	}
	return errors.Join(errsOut...)
}
