package action

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
)

// Change ops.
const (
	// OpCreate: the effect did not exist and the program made it.
	OpCreate = "create"
	// OpModify: the effect existed and its bytes changed.
	OpModify = "modify"
)

// PlanTTL is how long a plan can be applied after its dry run.
const PlanTTL = 24 * time.Hour

// Change is one file an apply writes: its path in the folder, create or
// modify, and the new bytes' size and hex SHA-256.
type Change struct {
	Path   string `json:"path"`
	Op     string `json:"op"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Plan is a dry run's outcome: its id, the digest of its change list (what
// an apply names), the changes sorted by path, and the program's exit code
// and output (each cut at MaxOutputBytes).
type Plan struct {
	ID       string   `json:"plan"`
	Digest   string   `json:"digest"`
	Changes  []Change `json:"changes"`
	ExitCode int      `json:"exit_code"`
	Stdout   string   `json:"stdout"`
	Stderr   string   `json:"stderr"`
}

// storedPlan is a plan as kept under StateDir/plans/<id>/plan.json, with
// its changed bytes in data/<index of the change>.
type storedPlan struct {
	Plan
	Created time.Time `json:"created"`
	// Folder is the folder the dry run ran on; the apply lands there.
	Folder string `json:"folder"`
	// Hosts are every host an input fetch reached, redirects included.
	Hosts []string `json:"hosts"`
	// Originals maps each changed path to the hex SHA-256 of the file the
	// dry run copied, "" when it did not exist.
	Originals map[string]string `json:"originals"`
}

// planIDPrefix starts every plan id; 20 base32 characters follow.
const planIDPrefix = "pl_"

var planB32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newPlanID returns "pl_" + 20 random lower-case base32 characters.
func newPlanID() string {
	var b [13]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("action: crypto/rand failed: " + err.Error())
	}
	return planIDPrefix + planB32.EncodeToString(b[:])[:20]
}

// validPlanID reports whether s has the shape newPlanID makes.
func validPlanID(s string) bool {
	if len(s) != len(planIDPrefix)+20 || !strings.HasPrefix(s, planIDPrefix) {
		return false
	}
	for _, c := range s[len(planIDPrefix):] {
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

// Digest is the hex SHA-256 of the canonical JSON of a change list: the
// changes sorted by path, encoded by encoding/json (an empty list is []).
func Digest(changes []Change) string {
	sorted := append([]Change{}, changes...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	raw, err := json.Marshal(sorted)
	if err != nil {
		panic("action: encode changes: " + err.Error())
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// planDir is where plan id is kept.
func (r *Runner) planDir(id string) string { return filepath.Join(r.stateDir, "plans", id) }

// savePlan writes the plan's changed bytes and then its record, each 0600
// in a 0700 folder: a plan without its record is never read.
func (r *Runner) savePlan(sp storedPlan, data [][]byte) error {
	dir := r.planDir(sp.ID)
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
		return fmt.Errorf("action: plan: %w", err)
	}
	for i, b := range data {
		if err := atomicfile.WriteNew(filepath.Join(dir, "data", strconv.Itoa(i)), b, 0o600); err != nil {
			return fmt.Errorf("action: plan: %w", err)
		}
	}
	raw, err := json.Marshal(sp)
	if err != nil {
		return fmt.Errorf("action: plan: %w", err)
	}
	if err := atomicfile.WriteNew(filepath.Join(dir, "plan.json"), raw, 0o600); err != nil {
		return fmt.Errorf("action: plan: %w", err)
	}
	return nil
}

// loadPlan reads plan id from dir (its folder): an id of the wrong shape,
// a missing record or an expired plan (removed then) is ReasonUnknownPlan.
func (r *Runner) loadPlan(id, dir string) (storedPlan, error) {
	var sp storedPlan
	if !validPlanID(id) {
		return sp, refuse(ReasonUnknownPlan, "no such plan")
	}
	raw, err := os.ReadFile(filepath.Join(dir, "plan.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return sp, refuse(ReasonUnknownPlan, id)
	}
	if err != nil {
		return sp, fmt.Errorf("action: plan: %w", err)
	}
	if err := json.Unmarshal(raw, &sp); err != nil || sp.ID != id || len(sp.Originals) != len(sp.Changes) {
		return sp, fmt.Errorf("action: plan %s: record does not parse", id)
	}
	if r.clock.Now().After(sp.Created.Add(PlanTTL)) {
		_ = os.RemoveAll(dir)
		return sp, refuse(ReasonUnknownPlan, id+" expired")
	}
	return sp, nil
}

// Summary returns the text shown to the person for plan id: the plan, its
// digest, each change (path quoted, op, size, SHA-256) in path order, and
// the hosts its inputs came from. The same plan always gives the same
// text.
func (r *Runner) Summary(planID string) (string, error) {
	sp, err := r.loadPlan(planID, r.planDir(planID))
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Action plan %s\nDigest %s\n", sp.ID, sp.Digest)
	fmt.Fprintf(&b, "The program exited with %d. Applying writes %d file(s) in the shared folder and nothing else; nothing is deleted.\n", sp.ExitCode, len(sp.Changes))
	for _, c := range sp.Changes {
		fmt.Fprintf(&b, "  %s %s (%d bytes, sha256 %s)\n", c.Op, strconv.QuoteToASCII(c.Path), c.Size, c.SHA256)
	}
	if len(sp.Hosts) > 0 {
		fmt.Fprintf(&b, "Inputs came from: %s\n", strings.Join(sp.Hosts, ", "))
	}
	return b.String(), nil
}

// PlanInfo is what a caller checks of a plan before asking the person to
// apply it: the folder it lands in, its digest and the paths it writes.
type PlanInfo struct {
	Folder string
	Digest string
	Paths  []string
}

// Info returns plan planID's PlanInfo (ReasonUnknownPlan when there is no
// such unspent, unexpired plan).
func (r *Runner) Info(planID string) (PlanInfo, error) {
	sp, err := r.loadPlan(planID, r.planDir(planID))
	if err != nil {
		return PlanInfo{}, err
	}
	pi := PlanInfo{Folder: sp.Folder, Digest: sp.Digest}
	for _, c := range sp.Changes {
		pi.Paths = append(pi.Paths, c.Path)
	}
	return pi, nil
}
