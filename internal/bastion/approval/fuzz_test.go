package approval

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// fuzzSecret and fuzzBastion are what the committed seeds were sealed
// with (testdata/fuzz).
var (
	fuzzSecret  = []byte("fuzz bastion key bytes 0123456789")
	fuzzBastion = "fuzz-bastion"
)

// FuzzOpen feeds Open arbitrary sealed bytes under a fixed key and
// additional data. It must not panic; what it refuses is ReasonSealBroken;
// the only thing that opens is the one committed seed sealed with that key
// and aad, whose plaintext is "fuzz plaintext".
func FuzzOpen(f *testing.F) {
	key := DeriveKey(fuzzSecret, "fuzz purpose")
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, sealed []byte) {
		pt, err := Open(key, []byte("fuzz aad"), sealed)
		var re *RefusedError
		switch {
		case err == nil:
			if string(pt) != "fuzz plaintext" {
				t.Fatalf("opened to %q", pt)
			}
		case !errors.As(err, &re) || re.Reason != ReasonSealBroken:
			t.Fatalf("Open: %v", err)
		}
	})
}

// FuzzDecodeOps feeds ops.json decoding and record opening arbitrary files.
// It must not panic; a file that does not decode is ReasonOpsDamaged;
// every record is listed once, in order; a valid one repeats its record's
// id, which no other record has, and holds a well-formed grant.
func FuzzDecodeOps(f *testing.F) {
	f.Add([]byte(`{"records":[]}`))
	key := opsKey(fuzzSecret)
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := decodeOps(data)
		if err != nil {
			var re *RefusedError
			if !errors.As(err, &re) || re.Reason != ReasonOpsDamaged {
				t.Fatalf("decodeOps: %v", err)
			}
			return
		}
		ids := map[string]int{}
		for _, r := range d.Records {
			ids[r.ID]++
		}
		list := openRecords(key, fuzzBastion, d)
		if len(list) != len(d.Records) {
			t.Fatalf("%d listed of %d records", len(list), len(d.Records))
		}
		for i, g := range list {
			if g.ID != d.Records[i].ID {
				t.Fatalf("record %d listed as %q, is %q", i, g.ID, d.Records[i].ID)
			}
			if g.Valid && (ids[g.ID] != 1 || !validOp(g.Kind) || g.PerHour < 1 || g.PerDay < 1 || !g.NotAfter.After(g.NotBefore)) {
				t.Fatalf("record %d holds a grant: %+v", i, g)
			}
			if !g.Valid && (g.Kind != "" || g.Runs != nil) {
				t.Fatalf("invalid record %d shows %+v", i, g)
			}
		}
	})
}

// seed reads a committed "go test fuzz v1" []byte seed.
func seed(t *testing.T, fuzz, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "fuzz", fuzz, name))
	must(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 || lines[0] != "go test fuzz v1" || !strings.HasPrefix(lines[1], "[]byte(") {
		t.Fatalf("seed %s/%s: %q", fuzz, name, b)
	}
	s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
	must(t, err)
	return []byte(s)
}

// TestFuzzSeedsReachTheValidPaths shows the seeds are not all refusals:
// the valid ones open, and the swapped one fails only the swapped record.
func TestFuzzSeedsReachTheValidPaths(t *testing.T) {
	pt, err := Open(DeriveKey(fuzzSecret, "fuzz purpose"), []byte("fuzz aad"), seed(t, "FuzzOpen", "valid"))
	if err != nil || string(pt) != "fuzz plaintext" {
		t.Fatalf("FuzzOpen/valid: %q %v", pt, err)
	}
	for name, want := range map[string][]bool{"valid": {true, true}, "swapped-blob": {false, true}, "duplicate": {false, false}, "edited": {false}} {
		d, err := decodeOps(seed(t, "FuzzDecodeOps", name))
		must(t, err)
		list := openRecords(opsKey(fuzzSecret), fuzzBastion, d)
		var got []bool
		for _, g := range list {
			got = append(got, g.Valid)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: valid %v, want %v", name, got, want)
		}
	}
}
