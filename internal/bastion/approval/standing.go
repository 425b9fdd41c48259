package approval

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
)

// Limits of standing grants.
const (
	// MaxWindow is the longest window a grant (standing or root) may have.
	MaxWindow = 30 * 24 * time.Hour
	// MaxPerDay is the highest rate a standing grant may allow.
	MaxPerDay = 10000
	// MaxStanding is how many standing grant records ops.json may hold.
	MaxStanding = 256
)

// Standing is one standing grant: op Kind may run without a fresh approval
// in [NotBefore, NotAfter), at most PerHour runs in any hour and PerDay in
// any day, counted from Runs (the runs of the last day). A record that does
// not open is listed with Valid false and only its ID.
type Standing struct {
	ID        string
	Kind      string
	NotBefore time.Time
	NotAfter  time.Time
	PerHour   int
	PerDay    int
	Runs      []time.Time
	Valid     bool
}

// opsDoc is ops.json: each record's grant sealed on its own.
type opsDoc struct {
	Records []opsRecord `json:"records"`
}

// opsRecord is one sealed standing grant in ops.json.
type opsRecord struct {
	ID     string `json:"id"`
	Sealed []byte `json:"sealed"` // base64 in JSON
}

// standingPlain is the plaintext of one sealed record. It repeats the
// record's id and the bastion id, which must match.
type standingPlain struct {
	V         int         `json:"v"`
	ID        string      `json:"id"`
	Bastion   string      `json:"bastion"`
	Kind      string      `json:"kind"`
	NotBefore time.Time   `json:"not_before"`
	NotAfter  time.Time   `json:"not_after"`
	PerHour   int         `json:"per_hour"`
	PerDay    int         `json:"per_day"`
	Runs      []time.Time `json:"runs"`
}

// opsKey is the seal key of ops.json records.
func opsKey(secret []byte) [32]byte { return DeriveKey(secret, purposeOps) }

// opsAAD is the additional data of the record id on bastion.
func opsAAD(bastion, id string) []byte {
	return []byte("bc-bastion-ops\x00" + bastion + "\x00" + id)
}

// decodeOps parses ops.json strictly: one object, no unknown fields.
func decodeOps(b []byte) (opsDoc, error) {
	var d opsDoc
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return opsDoc{}, refuse(ReasonOpsDamaged, "ops.json does not parse")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return opsDoc{}, refuse(ReasonOpsDamaged, "ops.json has data after its object")
	}
	return d, nil
}

// openRecords opens every record of d for bastion under key. A record that
// does not open, whose plaintext names another id or bastion, that is
// malformed, or whose id appears twice in d, is listed invalid.
func openRecords(key [32]byte, bastion string, d opsDoc) []Standing {
	seen := map[string]int{}
	for _, r := range d.Records {
		seen[r.ID]++
	}
	out := make([]Standing, len(d.Records))
	for i, r := range d.Records {
		out[i] = Standing{ID: r.ID}
		if seen[r.ID] != 1 {
			continue
		}
		pt, err := Open(key, opsAAD(bastion, r.ID), r.Sealed)
		if err != nil {
			continue
		}
		var p standingPlain
		if json.Unmarshal(pt, &p) != nil || p.V != fileVersion || p.ID != r.ID || p.Bastion != bastion ||
			!validOp(p.Kind) || p.PerHour < 1 || p.PerDay < 1 || !p.NotAfter.After(p.NotBefore) {
			continue
		}
		out[i] = Standing{ID: p.ID, Kind: p.Kind, NotBefore: p.NotBefore, NotAfter: p.NotAfter,
			PerHour: p.PerHour, PerDay: p.PerDay, Runs: p.Runs, Valid: true}
	}
	return out
}

// sealRecord seals g as the record g.ID of this bastion.
func (s *Store) sealRecord(g Standing) (opsRecord, error) {
	pt, err := json.Marshal(standingPlain{V: fileVersion, ID: g.ID, Bastion: s.bastion, Kind: g.Kind,
		NotBefore: g.NotBefore, NotAfter: g.NotAfter, PerHour: g.PerHour, PerDay: g.PerDay, Runs: g.Runs})
	if err != nil {
		return opsRecord{}, fmt.Errorf("approval: encode grant: %w", err)
	}
	b, err := Seal(opsKey(s.secret), opsAAD(s.bastion, g.ID), pt)
	if err != nil {
		return opsRecord{}, err
	}
	return opsRecord{ID: g.ID, Sealed: b}, nil
}

// loadOps reads ops.json (missing: no records); one that does not parse
// is ReasonOpsDamaged.
func (s *Store) loadOps() (opsDoc, error) {
	b, ok, err := s.readFile(opsFile)
	var re *RefusedError
	switch {
	case errors.As(err, &re):
		return opsDoc{}, refuse(ReasonOpsDamaged, "ops.json is too large")
	case err != nil || !ok:
		return opsDoc{}, err
	}
	return decodeOps(b)
}

// saveOps writes ops.json whole (0600).
func (s *Store) saveOps(d opsDoc) error {
	if d.Records == nil {
		d.Records = []opsRecord{}
	}
	b, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("approval: encode ops.json: %w", err)
	}
	return atomicfile.Write(s.path(opsFile), b, 0o600)
}

// ListStanding returns every record of ops.json in file order; one that
// holds no grant is listed with Valid false and only its ID.
func (s *Store) ListStanding() ([]Standing, error) {
	d, err := s.loadOps()
	if err != nil {
		return nil, err
	}
	return openRecords(opsKey(s.secret), s.bastion, d), nil
}

// DropStanding removes the record id (valid or not) from ops.json;
// ReasonUnknownGrant if there is none.
func (s *Store) DropStanding(id string) error {
	return s.withLock(func() error {
		d, err := s.loadOps()
		if err != nil {
			return err
		}
		n := len(d.Records)
		d.Records = slices.DeleteFunc(d.Records, func(r opsRecord) bool { return r.ID == id })
		if len(d.Records) == n {
			return refuse(ReasonUnknownGrant, "no standing grant with that id")
		}
		return s.saveOps(d)
	})
}

// DropAllStanding empties ops.json, also one that does not parse, and
// returns how many records it held.
func (s *Store) DropAllStanding() (int, error) {
	n := 0
	err := s.withLock(func() error {
		d, err := s.loadOps()
		var re *RefusedError
		if err != nil && !errors.As(err, &re) {
			return err
		}
		n = len(d.Records)
		return s.saveOps(opsDoc{})
	})
	return n, err
}
