package desiredstate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
)

// StateFile is the name of the checker's state file in Config.StateDir.
const StateFile = "desired-state.json"

// maxStateFile bounds the state file read back (16 roots of a few KiB).
const maxStateFile = 1 << 20

// state is what the checker learnt and must not forget across restarts.
type state struct {
	// TrustDomain, BundleIssuedAt and Roots are of the last trust bundle
	// accepted: its trust domain, issue time (unix seconds) and the DER of
	// its command roots that were pinned when it was accepted.
	TrustDomain    string   `json:"trust_domain,omitempty"`
	BundleIssuedAt int64    `json:"bundle_issued_at,omitempty"`
	Roots          [][]byte `json:"roots,omitempty"`
	BundleAtMs     int64    `json:"bundle_at_ms,omitempty"`
	// NodeID is the node the desired states name (learnt on first use
	// when root's config does not give it).
	NodeID string `json:"node_id,omitempty"`
	// Generation is the highest generation accepted, at AppliedAtMs.
	Generation  uint64 `json:"generation,omitempty"`
	AppliedAtMs int64  `json:"applied_at_ms,omitempty"`
}

// loadState reads dir's state file; a missing one is the empty state.
func loadState(dir string) (state, error) {
	raw, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return state{}, nil
	}
	if err != nil {
		return state{}, fmt.Errorf("desiredstate: read state: %w", err)
	}
	if len(raw) > maxStateFile {
		return state{}, errors.New("desiredstate: state file too large")
	}
	var st state
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return state{}, fmt.Errorf("desiredstate: decode state: %w", err)
	}
	return st, nil
}

// saveState writes st to dir's state file atomically, mode 0600, making
// dir (0700) when it is missing.
func saveState(dir string, st state) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("desiredstate: state directory: %w", err)
	}
	raw, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("desiredstate: encode state: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, StateFile), raw, 0o600); err != nil {
		return fmt.Errorf("desiredstate: write state: %w", err)
	}
	return nil
}
